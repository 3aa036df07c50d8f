"""LayerNorm followed by Mish (every hidden layer) or SimNorm (latent outputs), fused on the CPU.

ATen's CPU mish costs ~10x an exp, and a softmax over groups of 8 is slow too; one
C++ pass (csrc/fused_cpu.cpp, built once per machine with the system compiler) does
LayerNorm + affine + activation per row. Elsewhere (CUDA, no compiler, or
TDMPC_FUSED=0) the plain formula runs; both compute the same function.

Per-group affine parameters cover the layouts the model uses with one call:
  x (..., G, D) with gamma (G, D)   -- one layer (G = 1), or dynamics+reward fused (G = 2)
  x (G, ..., D) with gamma (G, D)   -- a Q-ensemble, heads first (heads_first=True)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from tdmpc.runtime.device import cpu_fast_paths

_SOURCE = Path(__file__).parent / "csrc" / "fused_cpu.cpp"
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
_LDFLAGS = ["-fopenmp"]
_lock = threading.Lock()
_state: dict[str, bool] = {}


def _build_tag() -> str:
    """What a built library depends on: the CPU's flags (-march=native), torch's version and ABI,
    the Python ABI, the compiler flags and the source. Venvs that agree share one build."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        pass
    key = "|".join([platform.machine(), flags, torch.__version__, str(torch._C._GLIBCXX_USE_CXX11_ABI),
                    sysconfig.get_config_var("SOABI") or "", *_CFLAGS, *_LDFLAGS, _SOURCE.read_bytes().hex()])
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def cache_dir() -> Path:
    return Path(os.environ.get("TDMPC_BUILD_DIR", Path.home() / ".cache" / "tdmpc"))


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The plain formula everywhere inside the block: the baseline that benchmarks compare against."""
    saved = dict(_state)
    _state["ok"] = False
    try:
        yield
    finally:
        _state.clear()
        _state.update(saved)


def extension_available() -> bool:
    """Load the CPU kernels (built on first use on this machine, ~30 s); False if that is impossible."""
    if "ok" in _state:
        return _state["ok"]
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _load()
    return _state["ok"]


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """An exclusive flock: the kernel releases it when its holder dies, however it dies, so a
    killed build can never leave a lock that makes later processes wait forever."""
    import fcntl  # POSIX; the kernels are only built on Linux

    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"tdmpc: waiting for another process building the fused CPU kernels ({path})", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load() -> bool:
    """A built library is loaded directly (no lock, no ninja); a missing one is built once, under
    build_lock, in a private directory, and renamed into place when complete."""
    if os.environ.get("TDMPC_FUSED", "1") == "0" or sys.platform != "linux":
        return False
    try:
        name = f"tdmpc_fused_{_build_tag()}"
        root = cache_dir()
        root.mkdir(parents=True, exist_ok=True)
        library = root / f"{name}.so"
        if not library.is_file():
            with build_lock(root / f".{name}.lock"):
                if not library.is_file():
                    _compile(name, root, library)
                    return True  # cpp_extension.load has loaded it already
        torch.ops.load_library(str(library))
        return True
    except Exception as e:  # no compiler, no ninja, an exotic platform: the plain formula still works
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        print(f"tdmpc: fused CPU kernels unavailable ({first}); using the plain formula", file=sys.stderr)
        return False


def _compile(name: str, root: Path, library: Path) -> None:
    from torch.utils.cpp_extension import load

    for stale in root.glob(f".build-{name}-*"):  # left by killed builds: we hold the lock, nobody uses them
        shutil.rmtree(stale, ignore_errors=True)
    print("tdmpc: building the fused CPU kernels (once per machine and torch version, ~30 s)...", file=sys.stderr)
    build = Path(tempfile.mkdtemp(dir=root, prefix=f".build-{name}-"))
    try:
        load(name=name, sources=[str(_SOURCE)], build_directory=str(build), is_python_module=False,
             extra_cflags=_CFLAGS, extra_ldflags=_LDFLAGS, verbose=False)
        os.replace(build / f"{name}.so", library)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _plain(x: Tensor, gamma: Tensor, beta: Tensor, act: str, heads_first: bool, group: int = 8) -> Tensor:
    if (act == "simnorm" and gamma.dim() == 1 and torch.compiler.is_compiling()
            and not (torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad))):
        return _ln_simnorm_pointwise(x, gamma, beta, group)  # its backward: 69 more kernels per update than softmax's
    if gamma.dim() == 1:  # one affine for every row: LayerNorm's own (one kernel)
        y = F.layer_norm(x, gamma.shape, gamma.to(x.dtype), beta.to(x.dtype))
    else:
        G, D = gamma.shape
        shape = (G,) + (1,) * (x.dim() - 2) + (D,) if heads_first else (G, D)
        y = torch.addcmul(beta.view(shape).to(x.dtype), F.layer_norm(x, (D,)), gamma.view(shape).to(x.dtype))
    if act == "mish":
        return F.mish(y)
    return torch.softmax(y.unflatten(-1, (-1, group)), dim=-1).flatten(-2)


def _ln_simnorm_pointwise(x: Tensor, gamma: Tensor, beta: Tensor, group: int) -> Tensor:
    """LayerNorm then SimNorm written for inductor to make one kernel of them, not two (compiled, without
    gradients: planning and the update's targets): a softmax over groups is a
    second reduction, its own kernel after the LayerNorm's (one per latent output: 19 of a compiled plan()'s at
    model size 5). Each output is 1 / sum_i exp(y_i - y), the same softmax, with every y_i of its group
    recomputed from x and the row's statistics, so that nothing but the row's mean and variance is a reduction.
    fp32 inside, as inductor's own softmax; it agrees with the two-kernel form to about 1e-6 relative."""
    xf = x.float()
    var, mean = torch.var_mean(xf, -1, keepdim=True, correction=0)
    mean, rstd = mean.unsqueeze(-1), torch.rsqrt(var + 1e-5).unsqueeze(-1)  # F.layer_norm's eps
    xg = xf.unflatten(-1, (-1, group))
    g, b = gamma.float().view(-1, group), beta.float().view(-1, group)
    y = (xg - mean) * rstd * g + b
    s = sum(((xg[..., i:i + 1] - mean) * rstd * g[:, i:i + 1] + b[:, i:i + 1] - y).exp() for i in range(group))
    return (1 / s).flatten(-2).to(x.dtype)


def _period(x: Tensor, G: int, heads_first: bool) -> int:
    return x.numel() // (G * x.shape[-1]) if heads_first else 1


class _LnMish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, gamma: Tensor, beta: Tensor, period: int) -> Tensor:
        ctx.save_for_backward(x, gamma, beta)
        ctx.period = period
        return torch.ops.tdmpc_fused.ln_act(x, gamma, beta, period, 0)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, gamma, beta = ctx.saved_tensors
        gx, gg, gb = torch.ops.tdmpc_fused.ln_mish_backward(grad.contiguous(), x, gamma, beta, ctx.period)
        return gx, gg, gb, None


def ln_act(x: Tensor, gamma: Tensor, beta: Tensor, act: str = "mish", heads_first: bool = False,
           group: int = 8) -> Tensor:
    """act(layer_norm(x) * gamma + beta), gamma/beta (G, D) per group (module doc); SimNorm over `group`."""
    # is_compiling() first: compiled code takes the plain formula, and loading the extension (a lock) would not trace
    fast = (not torch.compiler.is_compiling() and cpu_fast_paths(x.device) and x.dtype in (torch.float32, torch.bfloat16)
            and x.is_contiguous() and gamma.dtype == torch.float32 and extension_available())
    grad = torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad)
    if not fast or (grad and act != "mish") or group > 64:
        return _plain(x, gamma, beta, act, heads_first, group)
    if gamma.dim() == 1:
        gamma, beta = gamma.unsqueeze(0), beta.unsqueeze(0)
    gamma, beta = gamma.contiguous(), beta.contiguous()
    period = _period(x, gamma.shape[0], heads_first)
    if grad:
        return _LnMish.apply(x, gamma, beta, period)
    return torch.ops.tdmpc_fused.ln_act(x, gamma, beta, period, 0 if act == "mish" else group)
