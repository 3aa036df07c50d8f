#!/usr/bin/env bash
#SBATCH --job-name=tdmpc
#SBATCH --output=slurm/logs/%x-%j.out
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#
# One tdmpc training run as a Slurm job that survives time limits and preemption.
# Submit from the repository root (the log path above is relative to it):
#
#   sbatch slurm/train.sh --cfg a4000.json --task walker-walk --seed 1
#   sbatch --time=4:00:00 --partition=gpu slurm/train.sh --cfg a4000.json   # sbatch options go before the script
#
# Arguments after the script go to `python -m tdmpc.train`, except those naming the run directory
# (--run-dir, --resume, --auto-resume: see below). The defaults above suit one
# 16 GB GPU; sweeps of tasks x seeds are submitted by slurm/sweep.sh as a job array.
#
# Run directory: $TDMPC_RUNS/slurm/<job name>/<job id>, the same after every requeue
# (array elements from sweep.sh: .../<array job id>/<task>/seed<seed>). When it holds a
# checkpoint, the job resumes from it: requeued jobs continue where they stopped. Choose it with
# TDMPC_RUNS or TDMPC_RUN_DIR (below), not with train flags, which the job refuses.
# Log: slurm/logs/<job name>-<job id>.out, appended to by every requeue; the run
# directory links to it as slurm-<job id>.out.
#
# Signals: Slurm sends USR1 about 3 minutes before the time limit (--signal above); this
# script forwards it to the trainer, which writes a checkpoint and exits with code 3, and
# then requeues the job. TERM (Slurm ending the job) is forwarded too; the job requeues
# itself after it only when the time limit or a preemption ended it, not after `scancel`
# (a user's decision) nor when Slurm is requeueing it anyway (`scontrol requeue`).
# `scancel --batch --signal=USR1 <job id>` checkpoints and requeues a job by hand.
#
# Environment (nothing site-specific is hard-coded; set these before sbatch, which
# passes your environment to the job, or put them in the TDMPC_SETUP file):
#   TDMPC_SETUP      a bash file sourced first (module loads, conda init, exports, ...)
#   TDMPC_MODULES    modules to load, e.g. "cuda/12.4 python/3.11"
#   TDMPC_CONDA_ENV  conda environment to activate
#   TDMPC_VENV       virtual environment directory to activate
#   TDMPC_PYTHON     the Python to run (default: python3)
#   TDMPC_RUNS       root of the run directories (default: runs, relative to the submit directory)
#   TDMPC_RUN_DIR    the run directory itself, e.g. to resume an earlier job's run in a new
#                    job; for a sweep, the directory holding <task>/seed<seed>
#   TORCHINDUCTOR_CACHE_DIR  inductor's compile cache; on shared storage, a job on another node (a
#                    requeue too) takes the compiled plan() and update() from it instead of compiling
#                    again (default: /tmp/torchinductor_$USER on each node)
# PYTORCH_CUDA_ALLOC_CONF defaults to expandable_segments:True (less fragmentation), and
# OMP_NUM_THREADS to the job's --cpus-per-task.
set -euo pipefail

log() { echo "[train.sh $(date '+%F %T')] $*"; }
die() { log "error: $*" >&2; exit 2; }

[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a Slurm job; submit it: sbatch slurm/train.sh [train args]"

# --- environment --------------------------------------------------------------------
# Setup files and activation scripts are not written for `set -u`.
set +u
if [ -n "${TDMPC_SETUP:-}" ]; then
    # shellcheck disable=SC1090  # the file is the user's
    source "$TDMPC_SETUP"
fi
if [ -n "${TDMPC_MODULES:-}" ]; then
    command -v module >/dev/null || die "TDMPC_MODULES is set but there is no 'module' command (load its init script in TDMPC_SETUP)"
    # shellcheck disable=SC2086  # one word per module
    module load $TDMPC_MODULES
fi
if [ -n "${TDMPC_CONDA_ENV:-}" ]; then
    command -v conda >/dev/null || die "TDMPC_CONDA_ENV is set but there is no 'conda' command"
    eval "$(conda shell.bash hook)"
    conda activate "$TDMPC_CONDA_ENV"
fi
if [ -n "${TDMPC_VENV:-}" ]; then
    # shellcheck disable=SC1091  # the venv is the user's
    source "$TDMPC_VENV/bin/activate"
fi
set -u
PYTHON=${TDMPC_PYTHON:-python3}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
export PYTHONUNBUFFERED=1  # the log shows the trainer's lines as they happen
# Without CPU binding torch starts a thread per core of the node, not of the allocation.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}

# --- run directory --------------------------------------------------------------------
# Job ids do not change when a job is requeued, so neither does the run directory. The job chooses it: a
# --run-dir, --resume or --auto-resume among the arguments would train where the requeued job never looks,
# so it is refused in one line (exit 2) before anything is written.
"$PYTHON" -m tdmpc.slurm_scripts --check-job -- "$@"
runs_root=${TDMPC_RUNS:-runs}
sweep_args=()
if [ -n "${SLURM_ARRAY_TASK_ID:-}" ] && [ -n "${TDMPC_SWEEP_TASKS:-}" ]; then
    # An element of a sweep (slurm/sweep.sh): array index i -> (task i / #seeds, seed i % #seeds).
    read -r -a tasks <<<"$TDMPC_SWEEP_TASKS"
    read -r -a seeds <<<"${TDMPC_SWEEP_SEEDS:?TDMPC_SWEEP_TASKS is set but TDMPC_SWEEP_SEEDS is not}"
    i=$SLURM_ARRAY_TASK_ID
    [ "$i" -lt $((${#tasks[@]} * ${#seeds[@]})) ] ||
        die "array index $i is outside the sweep (${#tasks[@]} tasks x ${#seeds[@]} seeds)"
    task=${tasks[i / ${#seeds[@]}]}
    seed=${seeds[i % ${#seeds[@]}]}
    sweep_args=(--task "$task" --seed "$seed")  # last, so they win over the same flags in a config
    run_dir=${TDMPC_RUN_DIR:-$runs_root/slurm/$SLURM_JOB_NAME/$SLURM_ARRAY_JOB_ID}/$task/seed$seed
else
    run_dir=${TDMPC_RUN_DIR:-$runs_root/slurm/$SLURM_JOB_NAME/$SLURM_JOB_ID}
fi
[ ! -e "$run_dir" ] || [ -d "$run_dir" ] ||
    die "the run directory $run_dir is a file (TDMPC_RUN_DIR names the run's folder, not its checkpoint)"
mkdir -p "$run_dir" 2>/dev/null || die "cannot make the run directory $run_dir (a file where a folder goes, or no permission)"

# The job's log file: linked from the run directory, and read for Slurm's reason when TERM comes.
job_log=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdErr=//p')
if [ -f "$job_log" ]; then
    ln -sfn "$(realpath "$job_log")" "$run_dir/slurm-$SLURM_JOB_ID.out"
fi
log_offset=$(stat -c %s "$job_log" 2>/dev/null || echo 0)  # Slurm's lines for this session come after it

if [ -f "$run_dir/checkpoints/latest.pt" ] || [ -f "$run_dir/checkpoints/previous.pt" ]; then
    mode="resuming"  # previous.pt alone: the trainer resumes from it (latest.pt gone with a session killed early)
    train_args=(--resume "$run_dir" "$@" "${sweep_args[@]}")
else
    mode="starting"  # the trainer moves aside the files of an earlier session that left no checkpoint
    train_args=(--run-dir "$run_dir" "$@" "${sweep_args[@]}")
fi

# How to go on by hand: a new job in this run directory with this job's arguments (a sweep element's task and
# seed included), so that a run with no checkpoint yet starts again as it was asked for, not from the defaults.
given=("$@" "${sweep_args[@]}")
resume_command="TDMPC_RUN_DIR=$(printf %q "$run_dir") sbatch slurm/train.sh"
[ ${#given[@]} -eq 0 ] || resume_command+=$(printf ' %q' "${given[@]}")

log "job $SLURM_JOB_ID${SLURM_ARRAY_TASK_ID:+ (array $SLURM_ARRAY_JOB_ID, index $SLURM_ARRAY_TASK_ID)} on $(hostname -s), restart ${SLURM_RESTART_COUNT:-0}; $mode $run_dir"
log "running: $PYTHON -m tdmpc.train ${train_args[*]}"

# --- train, forwarding signals ----------------------------------------------------------
# Bash runs a trap only between commands, so the trainer runs in the background and the
# script waits for it with `wait`, which a trapped signal interrupts at once.
got_signal=""
started=$(date +%s)  # a checkpoint newer than this was written by this session's trainer
forward() {  # USR1|TERM
    got_signal=$1
    log "got SIG$1; asking the trainer to write a checkpoint and stop"
    kill -s "$1" "$trainer" 2>/dev/null || true
}
if [ "${SLURM_NTASKS:-1}" -gt 1 ]; then
    # Data-parallel (slurm/train_multi.sh): one rank per task, rendezvous at the first node of the job.
    # srun passes USR1 and TERM on to every rank; the ranks stop together and rank 0 writes the checkpoint.
    MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    export MASTER_ADDR MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))} WORLD_SIZE=$SLURM_NTASKS
    log "$SLURM_NTASKS ranks on $SLURM_JOB_NODELIST, rendezvous at $MASTER_ADDR:$MASTER_PORT"
    srun --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID exec "$0" -m tdmpc.train "$@"' \
        "$PYTHON" "${train_args[@]}" &
else
    "$PYTHON" -m tdmpc.train "${train_args[@]}" &
fi
trainer=$!
trap 'forward USR1' USR1
trap 'forward TERM' TERM
while :; do
    wait "$trainer" && rc=0 || rc=$?
    kill -0 "$trainer" 2>/dev/null || break  # else a signal interrupted the wait: keep waiting
done
wait "$trainer" && rc=0 || rc=$?  # its exit status, even if the last wait was interrupted
trap '' USR1 TERM                # from here on Slurm's TERM only means the job is going away

# Why Slurm sent TERM: just before it, slurmstepd writes a line into the job's log,
# "*** JOB <id> ON <node> CANCELLED AT <time> DUE TO TIME LIMIT ***" (or PREEMPTION,
# JOB REQUEUE, NODE FAILURE), with no reason when a user cancelled the job. Its text need not start a
# line: the progress bar's last frame (no newline) usually comes right before it. No such line: no reason.
term_reason() {
    [ -f "$job_log" ] || return 0
    tail -c +"$((log_offset + 1))" "$job_log" | tr '\r' '\n' |
        { grep -a "slurmstepd.*\*\*\* JOB $SLURM_JOB_ID ON .* CANCELLED AT" || true; } |
        tail -n 1 | sed -n 's/.* DUE TO \([A-Z ]*[A-Z]\) \*\*\*.*/\1/p'
}

case $rc in
    0)
        log "the run is finished: $run_dir"
        exit 0 ;;
    3) log "the trainer wrote a checkpoint and stopped" ;;
    *)
        # Killed by a signal (the trainer exits 3 once its handlers are set, also for a second
        # signal): the run goes on from its last checkpoint (or from the start).
        ckpt="$run_dir/checkpoints/latest.pt"
        if [ -n "$got_signal" ] && [ "$rc" -gt 128 ] && [ -f "$ckpt" ] &&
            [ "$(stat -c %Y "$ckpt" 2>/dev/null || echo 0)" -ge "$started" ]; then
            log "the trainer was ended by a signal (exit code $rc) after SIG$got_signal, once it had" \
                "written a checkpoint"
        elif [ -n "$got_signal" ] && [ "$rc" -gt 128 ]; then
            log "the trainer was stopped by SIG$got_signal before it could write a checkpoint"
        else
            log "the trainer failed (exit code $rc); not requeueing. Fix the cause, then go on: $resume_command"
            exit "$rc"
        fi ;;
esac

if [ "$got_signal" = TERM ]; then
    reason=$(term_reason)
    case $reason in
        "TIME LIMIT" | PREEMPTION) log "Slurm ended the job (${reason,,})" ;;
        "JOB REQUEUE")
            log "Slurm is requeueing the job; it will resume from $run_dir/checkpoints"
            exit 3 ;;
        *)
            log "the job ended (${reason:-cancelled by a user}); not requeueing it. Resume by hand:" \
                "$resume_command"
            exit 3 ;;
    esac
fi
log "requeueing job $SLURM_JOB_ID; it will resume from $run_dir/checkpoints"
scontrol requeue "$SLURM_JOB_ID" || {
    log "scontrol requeue failed; resume by hand: $resume_command"
    exit 3
}
