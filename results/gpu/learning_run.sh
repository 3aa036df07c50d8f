#!/usr/bin/env bash
# Issue 30 on a lent GPU: the seven DMC tasks at a4000.json (unchanged), 100k env steps, each process capped at
# 16 GiB, as many side by side as finish before the lease ends. Run from the checkout root with .devsite/
# carried (../shared/tools/device_bundle.sh). Every call packs what there is into $OUT (learning.tar.gz).
#
#   STAGE=start (call 1): measure how many runs at once give each run what rate (bench --e2e-procs, with CUDA
#     MPS where it starts, else time-sliced), choose the way that finishes the most pending runs before
#     DEADLINE_ALL and keep only those runs, start them in the background with tdmpc.reproduce --jobs (setsid:
#     it outlives the call while the machine is held), then poll until this call's DEADLINE.
#   STAGE=poll (calls 2..., at once: the machine goes back 30 s after a call ends): poll until DEADLINE.
#
# A run's checkpoint (68 MiB at model size 5: weights, target Qs and Adam's moments; learning/dry-run-16GiB.txt)
# can neither come back (16 MiB per file) nor travel in again (64 MiB in all), so a run cut off by the lease is
# lost but for its CSVs: hence only runs that can finish are started. Finished runs come back as CSVs and logs;
# commit them under results/gpu/learning/runs/ (pixel-runs/) and the next lease's grid skips them (reproduce sees their
# evaluation at 100k).
set -u
STAGE=${STAGE:-start}; DEADLINE=${DEADLINE:-560}; T0=$SECONDS
DEADLINE_ALL=${DEADLINE_ALL:-720}  # seconds of runs this lease can still give, counted from this call's start
TASKS=${TASKS:-cartpole-swingup,cup-catch,finger-spin,reacher-easy,walker-walk,pendulum-swingup,cheetah-run}
SEEDS=${SEEDS:-1}
PROBE_GIVEN=${PROBE:-}; PROBE=${PROBE:-1 3 7}  # none: no probe (it costs 4-6 of a lease's 15 minutes); JOBS lanes at once, under MPS if it starts
JOBS=${JOBS:-7}; JOBS_SLICED=${JOBS_SLICED:-$JOBS}; PRUNE=${PRUNE:-0}  # PRUNE=1: stop the last-listed lane while the rates say not all finish in time
# JOBS_SLICED: lanes when MPS does not start
CUDA_TESTS_AT=${CUDA_TESTS_AT:-}  # seconds into call 1: the suite's CUDA tests beside the runs (nice, -n 2)
# OBS=rgb: the pixel runs (64x64 frames, --obs rgb), rendered through EGL with the loader carried in .gl/ (the
# device README: the image has no libEGL), in their own work folder and kept runs (learning/pixel-runs/), with a
# replay buffer of PIXEL_BUFFER transitions (a 100k-env-step run stores 50k; at a4000.json's 1M it would be 34 GiB
# of pinned host memory per run); no probe (the bench measures state runs)
OBS=${OBS:-state}; PIXEL_BUFFER=${PIXEL_BUFFER:-100000}
# Overridden only to rehearse the script on a CPU (results/gpu/README.md):
DEVICE=${DEVICE:-cuda}; CFG=${CFG:-a4000.json}; STEPS=${STEPS:-100000}; AGENT_STEPS=${AGENT_STEPS:-50000}
BENCH_STEPS=${BENCH_STEPS:-"--e2e-steps 300 --warmup-steps 300"}; TRAIN_FLAGS=${TRAIN_FLAGS:-"--gpu-mem 16GiB --no-progress"}
WORK=${WORK:-/tmp/w30}; SITE=${SITE:-.devsite/site.tar.gz}  # the work folder; the device's bundle (if there: install)
R=$PWD; W=$WORK; KEPT=$R/results/gpu/learning/runs
OBS_FLAGS="--obs $OBS"
if [ "$OBS" = rgb ]; then
  W=$WORK-rgb KEPT=$R/results/gpu/learning/pixel-runs OBS_FLAGS="--obs rgb --buffer-size $PIXEL_BUFFER"
  [ -z "$PROBE_GIVEN" ] || [ "$PROBE_GIVEN" = none ] || echo "OBS=rgb: no probe (the bench measures state runs)"
  PROBE=none
fi
TRAIN_FLAGS="$TRAIN_FLAGS $OBS_FLAGS"
O=$W/out; mkdir -p $O
if [ "$STAGE" = poll ] && [ ! -s $O/lanes.txt ]; then  # e.g. a poll call without the start call's OBS
  echo "no lanes were started in $W (OBS=$OBS): poll with the start call's OBS"; exit 2
fi
source results/gpu/compile_cache.sh
pack() {  # the results first: the cache (compile_cache.sh) only adds a file if it can travel in again
  tar -czf $OUT/learning.tar.gz -C $W --exclude='*.pt' --exclude='*.h5' --exclude='*.tmp' --exclude='.lock' out runs 2>/dev/null
  cp $O/progress.txt $OUT/ 2>/dev/null
  pack_compile_cache; cp $O/cache.txt $OUT/ 2>/dev/null
}
trap pack EXIT
left() { echo $(( DEADLINE - (SECONDS - T0) )); }

if [ -f "$SITE" ]; then  # the device: the bundle and this checkout, installed
  if [ "$STAGE" = start ]; then
    mkdir -p /tmp/site && tar -xzf "$SITE" -C /tmp/site &&
    python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/site . > $O/install.log 2>&1
  fi
  export PYTHONPATH=/tmp/site
fi
# MUJOCO_GL=glfw: state tasks render nothing, and the H200 image had no libEGL (results/gpu/README.md)
export MUJOCO_GL=glfw PYTHONUNBUFFERED=1 CUDA_MPS_PIPE_DIRECTORY=$W/mps CUDA_MPS_LOG_DIRECTORY=$W/mps
if [ "$OBS" = rgb ]; then
  if [ "$DEVICE" = cuda ] && ! ldconfig -p | grep -q 'libEGL\.so\.1'; then  # the device: the carried loader
    ls .gl/*.deb > /dev/null 2>&1 || { echo "OBS=rgb: no libEGL here and no .gl/ carried (results/gpu/README.md)"; exit 1; }
    for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    nvidia=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    [ -f $nvidia ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$nvidia
  fi
  export MUJOCO_GL=egl
fi
use_compile_cache $W/inductor $O/cache.txt  # results/gpu/compile_cache.sh
mkdir -p $W/mps
cd $W

if [ "$STAGE" = start ]; then
  # Preflight (about 20 s): the first task at CFG, eager, a few hundred steps past seeding, on this device. A run
  # that fails only on the device (2026-11-27: every numpy-env run failed on CUDA right after seeding, a path no
  # CPU test takes) ends the call here, with a lease's minutes left, not after the lanes' compile and the tests.
  if [ "${PREFLIGHT:-1}" = 1 ]; then
    timeout 120 python3 -m tdmpc.train --cfg "$CFG" --task "${TASKS%%,*}" --device $DEVICE --steps 600 --seed-steps 400 \
      --eval-freq 600 --eval-episodes 1 --no-compile --no-progress --no-tensorboard --threads 1 --run-dir $W/preflight \
      $OBS_FLAGS \
      > $O/preflight.log 2>&1 || { echo "preflight failed (out/preflight.log):"; tail -n 5 $O/preflight.log; exit 1; }
    # its peak memory (eager) beside the estimate: lease 2026-11-29's runs peaked above it (results/gpu/README.md)
    cp $W/preflight/train.csv $O/preflight-train.csv 2>/dev/null
  fi
  { nvidia-smi; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
    nproc; } > $O/machine.txt 2>&1
  mkdir -p runs && cp -r $KEPT/. runs/ 2>/dev/null  # finished in an earlier lease
  if [ "$PROBE" != none ]; then
    # Per-run rate alone and side by side, time-sliced; then with MPS (kernels of several processes at once; a
    # user-space daemon: no device setting changes).
    B="python3 -m tdmpc.bench --device $DEVICE --task walker-walk --sizes 5 --envs 1 --e2e-envs $BENCH_STEPS
       --rss-steps 0 --offline-updates 0 --no-compare-plain"
    timeout 240 $B --e2e-procs $PROBE --out $O/procs.json > $O/procs.log 2>&1
    if command -v nvidia-cuda-mps-control > /dev/null && nvidia-cuda-mps-control -d 2>> $O/mps.log &&
       timeout 60 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()" 2>> $O/mps.log; then
      timeout 150 $B --e2e-procs ${PROBE##* } --out $O/procs-mps.json > $O/procs-mps.log 2>&1
    fi
    # The runs that can finish: for each way measured (N at once, MPS or not), a run takes AGENT_STEPS at its
    # measured rate plus about 90 s of start-up and evaluation, and N run per round; take the way that finishes
    # the most of the grid's pending runs in the time left (fewer at once on a tie), and start only those runs.
    read -r JOBS MPS CELLS < <(python3 $R/results/gpu/lanes.py choose "$O" "$(( DEADLINE_ALL - (SECONDS - T0) ))" \
                               "$AGENT_STEPS" "$STEPS" "$TASKS" "$SEEDS" runs)
  else  # no probe: JOBS lanes at once, under MPS where its daemon starts
    MPS=0
    command -v nvidia-cuda-mps-control > /dev/null && nvidia-cuda-mps-control -d 2>> $O/mps.log &&
      timeout 60 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()" 2>> $O/mps.log && MPS=1
    [ "$MPS" = 1 ] || JOBS=$JOBS_SLICED  # time-sliced, fewer at once keep their rate
    CELLS=$JOBS  # one run per lane: a second could not finish in a lease at size 5
  fi
  JOBS=${JOBS:-1} MPS=${MPS:-0} CELLS=${CELLS:-1}  # if the choice failed
  [ "$MPS" = 1 ] || { command -v nvidia-cuda-mps-control > /dev/null && echo quit | nvidia-cuda-mps-control; }
  # JOBS lanes over the first CELLS pending runs (lanes.py: seed by seed), each lane tdmpc.reproduce once per run, in
  # its own process group (setsid: it outlives the call while the machine is held, and PRUNE can stop a lane whole)
  python3 $R/results/gpu/lanes.py split "$TASKS" "$SEEDS" "$JOBS" "$CELLS" "$STEPS" runs > $O/lanes.in
  echo "jobs $JOBS, mps $MPS, lanes: $(paste -sd ' ' $O/lanes.in)" | tee -a $O/machine.txt
  : > $O/lanes.txt; i=0
  while read -r cells; do
    # shellcheck disable=SC2016,SC2086  # the lane's own script; TRAIN_FLAGS: several flags
    # its own pid, once it leads its session: $! would be setsid's where setsid has to fork (under job control)
    setsid nohup bash -c 'echo $$ > "$0"; cells=$1; shift; for c in ${cells//,/ }; do
                            python3 -m tdmpc.reproduce --tasks "${c%:*}" --seeds "${c##*:}" "$@"; done' \
      $O/lane-$i.pid "$cells" --cfg "$CFG" --steps "$STEPS" --runs-root $W/runs -- $TRAIN_FLAGS \
      > $O/reproduce-$i.log 2>&1 < /dev/null &
    until [ -s $O/lane-$i.pid ]; do sleep 0.1; done
    echo "$(cat $O/lane-$i.pid) $cells" >> $O/lanes.txt; i=$((i + 1))
  done < $O/lanes.in
  # Beside the lanes (no device time of its own): what is live at an eager run's memory peak, seeding and two
  # evaluations of the first task; lease D's runs peaked above the estimate by about the buffer's size
  # (results/gpu/README.md). PEAK=0: not run.
  if [ "${PEAK:-1}" = 1 ] && [ "$OBS" = state ] && [ "$DEVICE" = cuda ]; then
    timeout 240 nice -n 10 python3 $R/results/gpu/learning/peak_allocations.py $O/peak-allocations.txt -- \
      --cfg "$CFG" --task "${TASKS%%,*}" --device $DEVICE --steps 1000 --seed-steps 1000 --eval-freq 1000 \
      --no-compile --no-progress --no-tensorboard --threads 1 --gpu-mem 16GiB --run-dir $W/peak \
      > $O/peak-allocations.log 2>&1 &
  fi
fi

# Poll: each run's last train.csv row (env step, its rate, its peak memory) and the evaluations so far.
# PRUNE (lanes.py): each lane's time to finish at its run's rate over its last 60 s of train.csv rows plus 30 s
# of final evaluation; while the slowest would end past DEADLINE_ALL, stop the last-listed lane (the others then get its
# share of the GPU), at most one per 45 s so the rates can settle.
LAST_PRUNE=-100; TESTS_PID=
while (( $(left) > 15 )); do
  sleep 10
  # from $W as device_run.sh does: in the checkout's root its tdmpc/ would shadow the install (which maps planners/ in);
  # with a cache of their own, so the runs' cache (the one packed) holds the runs' graphs only (lease C's, with the
  # tests' model sizes in it, came to 31 MB packed)
  if [ -n "$CUDA_TESTS_AT" ] && [ -z "$TESTS_PID" ] && (( SECONDS - T0 >= CUDA_TESTS_AT )); then
    TORCHINDUCTOR_CACHE_DIR=$W/inductor-tests timeout $(( $(left) - 20 )) nice -n 10 python3 -m pytest -c $R/pyproject.toml --rootdir $R -m gpu -vv -n 2 \
      -p no:cacheprovider $R/tests/test_cuda.py $R/tests/test_memory.py > $O/cuda-tests.log 2>&1 & TESTS_PID=$!
  fi
  { date; for f in $O/reproduce-*.log; do tail -n 2 "$f"; done
    for csv in runs/*/seed*/train.csv; do
      [ -f "$csv" ] && echo "$csv: $(head -n 1 "$csv" | tr -d '\r')" && tail -n 1 "$csv"; done
    for csv in runs/*/seed*/eval.csv; do [ -f "$csv" ] && echo "$csv: $(tail -n 1 "$csv")"; done
  } > $O/progress.txt 2>&1
  alive=$(while read -r pid _; do kill -0 "$pid" 2> /dev/null && echo "$pid"; done < $O/lanes.txt)
  [ -n "$alive" ] || break  # the grid is done (or stopped)
  if [ "$PRUNE" = 1 ] && (( SECONDS - LAST_PRUNE >= 45 )); then
    victim=$(python3 $R/results/gpu/lanes.py prune $O/lanes.txt runs "$STEPS" "$(( DEADLINE_ALL - (SECONDS - T0) ))" \
             "$alive" "${PRUNE_FROM:-20000}" 2>> $O/prune.log)
    if [ -n "$victim" ]; then
      echo "$(( SECONDS - T0 )) s: stopping lane $victim ($(grep "^$victim " $O/lanes.txt))" | tee -a $O/prune.log
      kill -TERM -- -"$victim"; LAST_PRUNE=$SECONDS
    fi
  fi
done
# the tests beside the runs get the rest of the call, unless a run failed: then the call returns at once, so the
# lease's minutes go to a fix (2026-11-27: the four runs failed at 100 s and the call waited 386 s for the tests)
if [ -n "$TESTS_PID" ]; then
  if grep -q "^error:" $O/reproduce-*.log 2>/dev/null; then kill "$TESTS_PID"; else wait "$TESTS_PID"; fi
fi
cat $O/progress.txt | tail -n 20
echo "done at $(( SECONDS - T0 )) s"
