// Fused LayerNorm + activation for the CPU, where ATen's mish is ~10x slower than exp.
//
// ln_act(x, gamma, beta, period, act): x is (R, D) contiguous, fp32 or bf16. Row r is
// normalised over D, scaled by gamma[(r / period) % G] and shifted by beta[same], then
//   act 0: mish(y) = y * tanh(softplus(y)) = y * n / (n + 2), n = e^y (e^y + 2)
//   act k > 0: SimNorm, a softmax over consecutive groups of k features (k <= 64).
// gamma/beta are (G, D) fp32. `period` lets one call serve an ensemble laid out as
// (heads, M, D) (period M) or a fused pair laid out as (M, 2, D) (period 1).
//
// The backward of LayerNorm + mish is here too, so training uses the same formula.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// Every per-element helper must inline into its loop, or the loop does not vectorise.
#define TDMPC_INLINE inline __attribute__((always_inline))

TDMPC_INLINE float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TDMPC_INLINE uint16_t f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

TDMPC_INLINE float clamp_hi(float x, float hi) { return x < hi ? x : hi; }  // vectorises, unlike std::fmin
TDMPC_INLINE float clamp(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

// e^x: x = n ln2 + r with n = round(x / ln2) and ln2 split in two (Cody-Waite) so r is exact,
// e^r from a degree-7 Taylor polynomial (|r| <= ln2/2, relative error < 1e-8), then 2^n via
// the exponent bits. Branch-free so the loops below vectorise.
TDMPC_INLINE float fast_exp(float x) {
  const float xc = clamp(x, -87.0f, 88.0f);
  const float n = std::nearbyint(xc * 1.4426950408889634f);
  float r = std::fma(n, -0.693145751953125f, xc);
  r = std::fma(n, -1.428606765330187e-06f, r);
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  int32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += static_cast<int32_t>(n) << 23;
  std::memcpy(&p, &bits, 4);
  return p;
}

template <typename T>
inline float load(const T* p, int64_t i);
template <>
TDMPC_INLINE float load<float>(const float* p, int64_t i) { return p[i]; }
template <>
TDMPC_INLINE float load<uint16_t>(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }

template <typename T>
inline void store(T* p, int64_t i, float v);
template <>
TDMPC_INLINE void store<float>(float* p, int64_t i, float v) { p[i] = v; }
template <>
TDMPC_INLINE void store<uint16_t>(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

constexpr float kEps = 1e-5f;
constexpr int64_t kMaxGroup = 64;

// y = (x - mean) * rstd, into fp32 scratch; returns rstd.
template <typename T>
inline float normalise_row(const T* __restrict__ x, float* __restrict__ y, int64_t D) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < D; ++i) sum += load(x, i);
  const float mean = sum / static_cast<float>(D);
  float var = 0.f;
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < D; ++i) {
    const float d = load(x, i) - mean;
    y[i] = d;
    var += d * d;
  }
  return 1.0f / std::sqrt(var / static_cast<float>(D) + kEps);
}

template <typename T>
void ln_mish_row(const T* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                 T* __restrict__ out, float* __restrict__ y, int64_t D) {
  const float rstd = normalise_row(x, y, D);
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) {
    const float v = y[i] * rstd * g[i] + b[i];
    const float e = fast_exp(clamp_hi(v, 20.0f));
    const float n = e * (e + 2.0f);
    store(out, i, v * n / (n + 2.0f));
  }
}

// Divide each group of 8 by its sum, two groups per AVX-512 vector: three permute+add steps
// leave every lane holding its group's sum. Returns false (touching nothing) when it cannot
// help: another group size or ISA, or a group whose sum underflowed (the caller redoes it).
inline bool normalise_groups_of_8(float* e, int64_t D, int64_t group) {
#if defined(__AVX512F__)
  if (group != 8 || D % 16 != 0) return false;
  const __m512 tiny = _mm512_set1_ps(1e-30f);
  for (int64_t i = 0; i < D; i += 16) {
    const __m512 v = _mm512_loadu_ps(e + i);
    __m512 s = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));         // pairs
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));                 // quads
    s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0xB1));           // 128-bit halves of each 256
    if (_mm512_cmp_ps_mask(s, tiny, _CMP_NLT_UQ) != 0xFFFF) return false;
  }
  for (int64_t i = 0; i < D; i += 16) {
    const __m512 v = _mm512_loadu_ps(e + i);
    __m512 s = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));
    s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0xB1));
    _mm512_storeu_ps(e + i, _mm512_div_ps(v, s));
  }
  return true;
#else
  (void)e, (void)D, (void)group;
  return false;
#endif
}

template <typename T>
void ln_simnorm_row(const T* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                    T* __restrict__ out, float* __restrict__ y, int64_t D, int64_t group) {
  const float rstd = normalise_row(x, y, D);
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) y[i] = y[i] * rstd * g[i] + b[i];
  // One shift by the row max keeps the exp pass flat and vectorised; a group lying far below
  // that max (possible with large LayerNorm gains) underflows and is redone with its own max.
  float m = y[0];
#pragma omp simd reduction(max : m)
  for (int64_t i = 1; i < D; ++i) m = y[i] > m ? y[i] : m;
  float* e = y + D;  // scratch holds 2 D floats
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) e[i] = fast_exp(y[i] - m);
  if (!normalise_groups_of_8(e, D, group)) {
    for (int64_t s = 0; s < D; s += group) {
      float sum = 0.f;
      for (int64_t k = 0; k < group; ++k) sum += e[s + k];
      if (!(sum > 1e-30f)) {
        float gm = y[s];
        for (int64_t k = 1; k < group; ++k) gm = y[s + k] > gm ? y[s + k] : gm;
        sum = 0.f;
        for (int64_t k = 0; k < group; ++k) sum += (e[s + k] = fast_exp(y[s + k] - gm));
      }
      const float inv = 1.0f / sum;
      for (int64_t k = 0; k < group; ++k) e[s + k] *= inv;
    }
  }
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) store(out, i, e[i]);
}

template <typename T>
void ln_act_kernel(const T* x, const float* gamma, const float* beta, T* out, int64_t R, int64_t D,
                   int64_t G, int64_t period, int64_t act) {
  const int64_t grain = std::max<int64_t>(1, 16384 / D);
  at::parallel_for(0, R, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(2 * D);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = (r / period) % G;
      if (act == 0)
        ln_mish_row(x + r * D, gamma + g * D, beta + g * D, out + r * D, scratch.data(), D);
      else
        ln_simnorm_row(x + r * D, gamma + g * D, beta + g * D, out + r * D, scratch.data(), D, act);
    }
  });
}

// Backward of out = mish(LN(x) * gamma + beta) for one row; accumulates dgamma/dbeta.
template <typename T>
void ln_mish_backward_row(const T* __restrict__ grad_out, const T* __restrict__ x, const float* __restrict__ g,
                          const float* __restrict__ b, T* __restrict__ grad_x, float* __restrict__ dgamma,
                          float* __restrict__ dbeta, float* __restrict__ xhat, float* __restrict__ gy, int64_t D) {
  const float rstd = normalise_row(x, xhat, D);
  float sum_gy = 0.f, sum_gy_xhat = 0.f;
#pragma omp simd reduction(+ : sum_gy, sum_gy_xhat)
  for (int64_t i = 0; i < D; ++i) {
    const float xh = xhat[i] * rstd;
    xhat[i] = xh;
    const float v = xh * g[i] + b[i];
    const float e = fast_exp(clamp_hi(v, 20.0f));
    const float n = e * (e + 2.0f);
    const float tsp = n / (n + 2.0f);  // tanh(softplus(v))
    const float sig = e / (e + 1.0f);  // sigmoid(v); d softplus / dv
    // d/dv [v tanh(softplus v)] = tsp + v sigmoid(v) (1 - tsp^2)
    const float dv = load(grad_out, i) * (tsp + v * sig * (1.0f - tsp * tsp));
    dgamma[i] += dv * xh;
    dbeta[i] += dv;
    const float gxh = dv * g[i];
    gy[i] = gxh;
    sum_gy += gxh;
    sum_gy_xhat += gxh * xh;
  }
  const float inv_d = 1.0f / static_cast<float>(D);
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) store(grad_x, i, rstd * (gy[i] - inv_d * (sum_gy + xhat[i] * sum_gy_xhat)));
}

template <typename T>
void ln_mish_backward_kernel(const T* grad_out, const T* x, const float* gamma, const float* beta, T* grad_x,
                             float* grad_gamma, float* grad_beta, int64_t R, int64_t D, int64_t G,
                             int64_t period) {
  const int64_t threads = at::get_num_threads();
  std::vector<float> partial(static_cast<size_t>(threads) * 2 * G * D, 0.f);  // per-thread dgamma, dbeta
  const int64_t grain = std::max<int64_t>(1, 16384 / D);
  at::parallel_for(0, R, grain, [&](int64_t begin, int64_t end) {
    float* mine = partial.data() + static_cast<size_t>(at::get_thread_num()) * 2 * G * D;
    std::vector<float> scratch(2 * D);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = (r / period) % G;
      ln_mish_backward_row(grad_out + r * D, x + r * D, gamma + g * D, beta + g * D, grad_x + r * D,
                           mine + g * 2 * D, mine + g * 2 * D + D, scratch.data(), scratch.data() + D, D);
    }
  });
  for (int64_t t = 0; t < threads; ++t) {
    const float* p = partial.data() + static_cast<size_t>(t) * 2 * G * D;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < D; ++i) {
        grad_gamma[g * D + i] += p[g * 2 * D + i];
        grad_beta[g * D + i] += p[g * 2 * D + D + i];
      }
  }
}

void check(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "ln_act: x must be a contiguous CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "ln_act: fp32 or bf16 only");
  TORCH_CHECK(gamma.scalar_type() == at::kFloat && beta.scalar_type() == at::kFloat && gamma.is_contiguous() &&
                  beta.is_contiguous() && gamma.dim() == 2 && gamma.sizes() == beta.sizes() &&
                  gamma.size(1) == x.size(-1),
              "ln_act: gamma/beta must be contiguous fp32 (G, D)");
}

at::Tensor ln_act(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, int64_t period,
                  int64_t act) {
  check(x, gamma, beta);
  const int64_t D = x.size(-1), R = x.numel() / D, G = gamma.size(0);
  TORCH_CHECK(act >= 0 && act <= kMaxGroup && (act == 0 || D % act == 0),
              "ln_act: SimNorm group must divide D and be at most 64");
  auto out = at::empty_like(x);
  if (x.scalar_type() == at::kFloat)
    ln_act_kernel<float>(x.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                         out.data_ptr<float>(), R, D, G, period, act);
  else
    ln_act_kernel<uint16_t>(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()),
                            gamma.data_ptr<float>(), beta.data_ptr<float>(),
                            reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), R, D, G, period, act);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ln_mish_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                                 const at::Tensor& gamma, const at::Tensor& beta,
                                                                 int64_t period) {
  check(x, gamma, beta);
  auto go = grad_out.contiguous().to(x.scalar_type());
  const int64_t D = x.size(-1), R = x.numel() / D, G = gamma.size(0);
  auto grad_x = at::empty_like(x);
  auto grad_gamma = at::zeros_like(gamma);
  auto grad_beta = at::zeros_like(beta);
  if (x.scalar_type() == at::kFloat)
    ln_mish_backward_kernel<float>(go.data_ptr<float>(), x.data_ptr<float>(), gamma.data_ptr<float>(),
                                   beta.data_ptr<float>(), grad_x.data_ptr<float>(), grad_gamma.data_ptr<float>(),
                                   grad_beta.data_ptr<float>(), R, D, G, period);
  else
    ln_mish_backward_kernel<uint16_t>(
        reinterpret_cast<const uint16_t*>(go.data_ptr<at::BFloat16>()),
        reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), gamma.data_ptr<float>(),
        beta.data_ptr<float>(), reinterpret_cast<uint16_t*>(grad_x.data_ptr<at::BFloat16>()),
        grad_gamma.data_ptr<float>(), grad_beta.data_ptr<float>(), R, D, G, period);
  return {grad_x, grad_gamma, grad_beta};
}

}  // namespace

TORCH_LIBRARY(tdmpc_fused, m) {
  m.def("ln_act(Tensor x, Tensor gamma, Tensor beta, int period, int act) -> Tensor");
  m.def("ln_mish_backward(Tensor grad_out, Tensor x, Tensor gamma, Tensor beta, int period) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tdmpc_fused, CPU, m) {
  m.impl("ln_act", &ln_act);
  m.impl("ln_mish_backward", &ln_mish_backward);
}
