#!/usr/bin/env bash
# One lent-GPU call for issue 35 (speed) and the suite's CUDA tests: every stage under its own time cap and
# one overall deadline, results packed into $OUT whatever stage the deadline stops. Run from the checkout root,
# with .devsite/ carried (../shared/tools/device_bundle.sh --reference; ref/ = the reference's tdmpc2/ folder,
# refgym/ = gymnasium 0.29.1 + termcolor for it, ref12.tar.gz = tensordict/torchrl 0.12 as a fallback pair).
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
REFARGS="task=walker-walk model_size=5 enable_wandb=false save_video=false save_agent=false eval_episodes=1 seed_steps=1000"
ref() {  # ref NAME CAP ARGS...: the reference with tensordict/torchrl 0.13; again with 0.12 if that import failed
  stage $1 $2 env PYTHONPATH=$R/.devsite/refgym:/tmp/site $REF $O/$1.json $REFARGS "${@:3}"
  if [ ! -s $O/$1.json ] && grep -qE "ImportError|ModuleNotFoundError|undefined symbol" $O/$1.log; then
    mkdir -p /tmp/ref12 && tar -xzf $R/.devsite/ref12.tar.gz -C /tmp/ref12
    stage $1-td012 $2 env PYTHONPATH=$R/.devsite/refgym:/tmp/ref12:/tmp/site $REF $O/$1-td012.json $REFARGS "${@:3}"
  fi
}
stage ours $((170)) $B --sizes 5 --envs 1 32 256 --e2e-envs 1 32 --e2e-steps 300 --warmup-steps 1000 --profile --no-compile --out $O/ours.json
ref reference 420 steps=3000  # 2026-11-26: 230 s reached step 1,500 of 2,500 (compiling, pretraining)
stage cuda-tests 240 python3 -m pytest -c $R/pyproject.toml --rootdir $R -m gpu $R/tests/test_cuda.py $R/tests/test_memory.py -vv -n 4 -p no:cacheprovider
stage seed-case-ours 60 $B --sizes 5 --envs 1 --horizon 8 --num-samples 256 --gpu-mem 16GiB --e2e-envs 1 --e2e-steps 200 --warmup-steps 500 --out $O/seed-case-ours.json
stage ours-compile 200 $B --sizes 5 --envs 1 32 --compile --e2e-envs 1 32 --e2e-steps 300 --warmup-steps 1000 --profile --out $O/ours-compile.json
stage update-stream 170 $B --sizes 5 --envs 1 --e2e-envs 1 32 --e2e-steps 300 --warmup-steps 1000 --update-stream --out $O/update-stream.json  # beside ours-compile: rounds on their own stream
TORCHINDUCTOR_SPLIT_REDUCTIONS=0 stage no-split 150 $B --sizes 5 --envs 1 --compile --e2e-envs 1 --e2e-steps 300 --warmup-steps 1000 --profile --out $O/no-split.json  # beside ours-compile: 212 kernels per update instead of 260 in the Triton count (results/kernel-cuts/)
stage combo 150 $B --sizes 5 --envs 1 --compile --combo-kernels --e2e-envs 1 --e2e-steps 300 --warmup-steps 1000 --profile --out $O/combo.json  # beside ours-compile: 186 kernels per update instead of 260 in the Triton count (results/kernels-combo.json)
TORCHINDUCTOR_SPLIT_REDUCTIONS=0 stage combo-no-split 150 $B --sizes 5 --envs 1 --compile --combo-kernels --e2e-envs 1 --e2e-steps 300 --warmup-steps 1000 --profile --out $O/combo-no-split.json  # both: 175 in the Triton count (results/kernels-combo-no-split.json)
stage no-overlap 100 $B --sizes 1 --envs 1 --e2e-envs 1 32 --e2e-steps 300 --warmup-steps 1000 --no-overlap-updates --out $O/no-overlap.json  # the reference's order, beside "ours"
ref seed-case-reference 150 steps=1500 horizon=8 num_samples=256 mem_gib=16
stage sizes 80 $B --sizes 1 19 48 --envs 1 32 --e2e-steps 0 --out $O/sizes.json
stage tf32-off 40 $B --sizes 5 --envs 1 --e2e-steps 0 --matmul-precision highest --out $O/tf32-off.json
echo "done at $(( SECONDS - T0 )) s"
