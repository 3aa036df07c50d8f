#!/usr/bin/env bash
# One lent-GPU call for issue 35 (speed) and the suite's CUDA tests: every stage under its own time cap and
# one overall deadline, results packed into $OUT whatever stage the deadline stops. Run from the checkout root,
# with .devsite/ carried (../shared/tools/device_bundle.sh --reference; ref/ = the reference's tdmpc2/ folder,
# refgym.tar.gz = gymnasium 0.29.1 + termcolor for it, ref12.tar.gz = tensordict/torchrl 0.12 as a fallback pair,
# optional: the tree, site.tar.gz and these must fit in the 64 MiB a call carries).
set -u
DEADLINE=${DEADLINE:-555}; T0=$SECONDS; O=/tmp/o; mkdir -p $O
left() { echo $(( DEADLINE - (SECONDS - T0) )); }
stage() {  # stage NAME CAP CMD...: run CMD with min(CAP, time left) seconds, log to $O/NAME.log
  local name=$1 cap=$2; shift 2; local t=$(left); (( t > cap )) && t=$cap
  if [ -n "${STAGES:-}" ] && [[ " $STAGES " != *" ${name%-td012} "* ]]; then return; fi  # STAGES="a b": only these
  if (( t < 15 )); then echo "== $name: skipped, $(left) s left" | tee -a $O/stages.txt; return; fi
  local s=$SECONDS; timeout -k 5 $t "$@" > $O/$name.log 2>&1; local rc=$?
  echo "== $name: rc $rc in $(( SECONDS - s )) s (cap $t s)" | tee -a $O/stages.txt; tail -n 4 $O/$name.log
}
source results/gpu/compile_cache.sh
use_compile_cache /tmp/w/inductor $O/cache.txt  # the reference's compiles too
pack() { cp $O/stages.txt $OUT/ 2>/dev/null; tar -czf $OUT/gpu.tar.gz -C $O . ; pack_compile_cache; cp $O/cache.txt $OUT/ 2>/dev/null; }
trap pack EXIT
mkdir -p /tmp/site && tar -xzf .devsite/site.tar.gz -C /tmp/site &&
python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/site . > $O/install.log 2>&1  # --upgrade: a warm machine keeps the last call's copy
# MUJOCO_GL=glfw: state tasks render nothing, and the image has no libEGL (PyOpenGL's EGL import fails)
export PYTHONPATH=/tmp/site MUJOCO_GL=glfw PYTHONUNBUFFERED=1
R=$PWD; mkdir -p /tmp/w; cd /tmp/w  # the installed package (planners/ maps into it), not the checkout's tdmpc/
{ nvidia-smi; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"; nproc; } > $O/machine.txt 2>&1
cat $O/machine.txt | head -20
B="python3 -m tdmpc.bench --device cuda --task walker-walk --rss-steps 0 --offline-updates 0 --no-compare-plain"
REF="python3 $R/results/gpu/reference_run.py $R/.devsite/ref"
mkdir -p /tmp/refgym && tar -xzf $R/.devsite/refgym.tar.gz -C /tmp/refgym
REFARGS="task=walker-walk model_size=5 enable_wandb=false save_video=false save_agent=false eval_episodes=1 seed_steps=1000"
ref() {  # ref NAME CAP ARGS...: the reference with tensordict/torchrl 0.13; again with 0.12 if that import failed
  stage $1 $2 env PYTHONPATH=/tmp/refgym:/tmp/site $REF $O/$1.json $REFARGS "${@:3}"
  if [ ! -s $O/$1.json ] && [ -f $R/.devsite/ref12.tar.gz ] && grep -qE "ImportError|ModuleNotFoundError|undefined symbol" $O/$1.log; then
    mkdir -p /tmp/ref12 && tar -xzf $R/.devsite/ref12.tar.gz -C /tmp/ref12
    stage $1-td012 $2 env PYTHONPATH=/tmp/refgym:/tmp/ref12:/tmp/site $REF $O/$1-td012.json $REFARGS "${@:3}"
  fi
}
stage ours $((170)) $B --sizes 5 --envs 1 32 256 --e2e-envs 1 32 --e2e-steps 300 --warmup-steps 1000 --profile --no-compile --out $O/ours.json
cuda_tests() { stage cuda-tests 240 python3 -m pytest -c $R/pyproject.toml --rootdir $R -o addopts= -m gpu $R/tests/test_cuda.py $R/tests/test_memory.py -v -n 4 -p no:cacheprovider --durations=0; }
# TESTS_BESIDE_REFERENCE=1: the CUDA tests (which time nothing) run while the reference compiles plan() and update()
# (2026-11-27: its first 260 s), so its steady state, timed after them, is measured on a quiet GPU
if [ -n "${TESTS_BESIDE_REFERENCE:-}" ]; then cuda_tests & tests_pid=$!; fi
ref reference 420 steps=3000  # 2026-11-27: 268 s reached the 1,043th update (plan compiled by 115 s, then update())
if [ -n "${tests_pid:-}" ]; then wait $tests_pid; else cuda_tests; fi
# SEED_CASES_TOGETHER=1: the two seed-case runs (peak memory only, no timing) side by side
if [ -n "${SEED_CASES_TOGETHER:-}" ]; then ref seed-case-reference 150 steps=1500 horizon=8 num_samples=256 mem_gib=16 & seed_pid=$!; fi
stage seed-case-ours 150 $B --sizes 5 --envs 1 --horizon 8 --num-samples 256 --gpu-mem 16GiB --e2e-envs 1 --e2e-steps 200 --warmup-steps 500 --out $O/seed-case-ours.json
stage ours-compile 200 $B --sizes 5 --envs 1 32 --compile --e2e-envs 1 32 --e2e-steps 300 --warmup-steps 1000 --profile --out $O/ours-compile.json
stage update-stream 170 $B --sizes 5 --envs 1 --e2e-envs 1 32 --e2e-steps 300 --warmup-steps 1000 --update-stream --out $O/update-stream.json  # beside ours-compile: rounds on their own stream
TORCHINDUCTOR_SPLIT_REDUCTIONS=0 stage no-split 150 $B --sizes 5 --envs 1 --compile --e2e-envs 1 --e2e-steps 300 --warmup-steps 1000 --profile --out $O/no-split.json  # beside ours-compile: 212 kernels per update instead of 260 in the Triton count (results/kernel-cuts/)
stage combo 150 $B --sizes 5 --envs 1 --compile --combo-kernels --e2e-envs 1 --e2e-steps 300 --warmup-steps 1000 --profile --out $O/combo.json  # beside ours-compile: 186 kernels per update instead of 260 in the Triton count (results/kernels-combo.json)
TORCHINDUCTOR_SPLIT_REDUCTIONS=0 stage combo-no-split 150 $B --sizes 5 --envs 1 --compile --combo-kernels --e2e-envs 1 --e2e-steps 300 --warmup-steps 1000 --profile --out $O/combo-no-split.json  # both: 175 in the Triton count (results/kernels-combo-no-split.json)
stage no-overlap 100 $B --sizes 1 --envs 1 --e2e-envs 1 32 --e2e-steps 300 --warmup-steps 1000 --no-overlap-updates --out $O/no-overlap.json  # the reference's order, beside "ours"
if [ -n "${seed_pid:-}" ]; then wait $seed_pid; else ref seed-case-reference 150 steps=1500 horizon=8 num_samples=256 mem_gib=16; fi
stage sizes 80 $B --sizes 1 19 48 --envs 1 32 --e2e-steps 0 --out $O/sizes.json
stage tf32-off 40 $B --sizes 5 --envs 1 --e2e-steps 0 --matmul-precision highest --out $O/tf32-off.json
echo "done at $(( SECONDS - T0 )) s"
