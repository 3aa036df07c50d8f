#!/usr/bin/env bash
# Issue 30 on a lent GPU: the seven DMC tasks at a4000.json (unchanged), 100k env steps, each process capped at
# 16 GiB, as many side by side as finish before the lease ends. Run from the checkout root with .devsite/
# carried (../shared/tools/device_bundle.sh). Every call packs what there is into $OUT (learning.tar.gz).
#
#   STAGE=start (call 1): measure how many runs at once give each run what rate (bench --e2e-procs, with CUDA
#     MPS where it starts, else time-sliced), choose the most runs that can each reach 100k before DEADLINE_ALL,
#     start the grid in the background (setsid: it outlives the call while the machine is held) with
#     tdmpc.reproduce --jobs, then poll until this call's DEADLINE.
#   STAGE=poll (calls 2..., at once: the machine goes back 30 s after a call ends): poll until DEADLINE.
#
# A run's checkpoints (68 MiB at model size 5: weights, target Qs and Adam's moments, learning/dry-run-16GiB.txt) cannot come back (64 MiB travels
# in, 16 MiB per file out), so a run cut off by the lease is lost but for its CSVs: hence only runs that can
# finish are started. Finished runs come back as CSVs and logs; commit them under results/gpu/learning/runs/
# and the next GPU session's grid skips them (reproduce sees their evaluation at 100k).
set -u
STAGE=${STAGE:-start}; DEADLINE=${DEADLINE:-560}; T0=$SECONDS
DEADLINE_ALL=${DEADLINE_ALL:-720}  # seconds of runs this lease can still give, counted from this call's start
TASKS=${TASKS:-cartpole-swingup,cup-catch,finger-spin,reacher-easy,walker-walk,pendulum-swingup,cheetah-run}
SEEDS=${SEEDS:-1}
PROBE=${PROBE:-1 3 7}
# Overridden only to rehearse the script on a CPU (results/gpu/README.md):
DEVICE=${DEVICE:-cuda}; CFG=${CFG:-a4000.json}; STEPS=${STEPS:-100000}; AGENT_STEPS=${AGENT_STEPS:-50000}
BENCH_STEPS=${BENCH_STEPS:-"--e2e-steps 300 --warmup-steps 300"}; TRAIN_FLAGS=${TRAIN_FLAGS:-"--gpu-mem 16GiB --no-progress"}
R=$PWD; W=/tmp/w30; O=$W/out; mkdir -p $O
pack() {
  tar -czf $OUT/learning.tar.gz -C $W --exclude='*.pt' --exclude='*.h5' --exclude='*.tmp' --exclude='.lock' out runs 2>/dev/null
  cp $O/progress.txt $OUT/ 2>/dev/null
}
trap pack EXIT
left() { echo $(( DEADLINE - (SECONDS - T0) )); }

if [ -f .devsite/site.tar.gz ]; then  # the device: the bundle and this checkout, installed
  if [ "$STAGE" = start ]; then
    mkdir -p /tmp/site && tar -xzf .devsite/site.tar.gz -C /tmp/site &&
    python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/site . > $O/install.log 2>&1
  fi
  export PYTHONPATH=/tmp/site
fi
# MUJOCO_GL=glfw: state tasks render nothing, and the H200 image had no libEGL (results/gpu/README.md)
export MUJOCO_GL=glfw PYTHONUNBUFFERED=1
cd $W

if [ "$STAGE" = start ]; then
  { nvidia-smi; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
    nproc; } > $O/machine.txt 2>&1
  mkdir -p runs && cp -r $R/results/gpu/learning/runs/. runs/ 2>/dev/null  # finished in an earlier lease
  # Per-run rate alone and side by side, time-sliced; then with MPS (kernels of several processes at once).
  B="python3 -m tdmpc.bench --device $DEVICE --task walker-walk --sizes 5 --envs 1 $BENCH_STEPS
     --rss-steps 0 --offline-updates 0 --no-compare-plain"
  timeout 200 $B --e2e-procs $PROBE --out $O/procs.json > $O/procs.log 2>&1
  if command -v nvidia-cuda-mps-control > /dev/null && nvidia-cuda-mps-control -d 2>> $O/mps.log &&
     timeout 60 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()" 2>> $O/mps.log; then
    timeout 120 $B --e2e-procs ${PROBE##* } --out $O/procs-mps.json > $O/procs-mps.log 2>&1
  fi
  # The most runs at once whose rate each reaches 100k env steps in the time left (50k agent steps at action
  # repeat 2, plus about 90 s of start-up and evaluation); MPS stays on only if it was faster.
  read -r JOBS MPS < <(python3 - "$O" "$(( DEADLINE_ALL - (SECONDS - T0) ))" "$AGENT_STEPS" <<'EOF'
import json, sys
from pathlib import Path
out, seconds, steps = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
rates = {}  # (mps, n) -> per-run agent steps/s (the slowest run's)
for mps, name in ((0, "procs.json"), (1, "procs-mps.json")):
    if (out / name).is_file():
        for n, p in json.loads((out / name).read_text()).get("end_to_end_by_procs", {}).items():
            rates[mps, int(n)] = min(p["agent_steps_per_s_each"])
fits = [(n, mps) for (mps, n), r in rates.items() if steps / r + 90 <= seconds]
n, mps = max(fits, key=lambda k: (k[0], rates[k[1], k[0]])) if fits else (1, 0)
print(n, mps)
json.dump({"rates": {f"{'mps' if m else 'sliced'} x{n}": r for (m, n), r in rates.items()}, "seconds_left": seconds,
           "jobs": n, "mps": bool(mps)}, open(out / "choice.json", "w"), indent=1)
EOF
)
  [ "$MPS" = 1 ] || { command -v nvidia-cuda-mps-control > /dev/null && echo quit | nvidia-cuda-mps-control; }
  echo "jobs $JOBS, mps $MPS" | tee -a $O/machine.txt
  # shellcheck disable=SC2086  # TRAIN_FLAGS: several flags
  setsid nohup python3 -m tdmpc.reproduce --tasks "$TASKS" --seeds "$SEEDS" --cfg "$CFG" --steps "$STEPS" \
    --jobs "$JOBS" --runs-root $W/runs -- $TRAIN_FLAGS > $O/reproduce.log 2>&1 < /dev/null &
fi

# Poll: each run's last train.csv row (env step, its rate, its peak memory) and the evaluations so far.
while (( $(left) > 15 )); do
  sleep 10
  { date; tail -n 3 $O/reproduce.log
    for csv in runs/*/seed*/train.csv; do
      [ -f "$csv" ] && echo "$csv: $(head -n 1 "$csv" | tr -d '\r')" && tail -n 1 "$csv"; done
    for csv in runs/*/seed*/eval.csv; do [ -f "$csv" ] && echo "$csv: $(tail -n 1 "$csv")"; done
  } > $O/progress.txt 2>&1
  pgrep -f "tdmpc.reproduce" > /dev/null || break  # the grid is done (or stopped)
done
cat $O/progress.txt | tail -n 20
echo "done at $(( SECONDS - T0 )) s"
