#!/usr/bin/env bash
# Submit a sweep of tasks x seeds as one Slurm job array of slurm/train.sh.
#
#   slurm/sweep.sh --tasks walker-walk,cheetah-run --seeds 1-3 -- --cfg a4000.json
#   slurm/sweep.sh --tasks cup-catch --seeds 1,2,5 --name cup --max-parallel 2 --time=12:00:00 -- --cfg a4000.json
#
# Options (before --):
#   --tasks T1,T2,...   tasks to train on
#   --seeds SPEC        seeds: 1-3, 1,2,5 or 1-3,7
#   --name NAME         job name, used in the run directories and log names (default: tdmpc)
#   --max-parallel N    at most N elements running at once (--array=...%N)
#   --dry-run           print the sbatch command line and the runs; submit nothing
#   anything else       passed to sbatch (--time=..., --partition=..., --gres=..., ...)
# After --: arguments for every run's `python -m tdmpc.train` (train.sh adds --task and --seed;
# --run-dir, --resume and --auto-resume are refused: set TDMPC_RUNS or TDMPC_RUN_DIR instead).
#
# Before it submits (and with --dry-run), the tasks and the train arguments are checked as each
# element's tdmpc.train will read them, by $TDMPC_PYTHON (default python3) on this machine: run it
# where tdmpc is installed. Bad input is one line starting with 'error:' and exit code 2.
#
# Element i of the array trains task i / #seeds with seed i % #seeds (train.sh does the
# mapping from SLURM_ARRAY_TASK_ID). Results: $TDMPC_RUNS/slurm/<name>/<array job id>/<task>/seed<seed>
# (TDMPC_RUNS defaults to runs), logs: slurm/logs/<name>-<array job id>_<index>.out.
# Every element checkpoints, requeues and resumes on its own, as a single train.sh job does.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "error: $*" >&2; exit 2; }

value() {  # OPTION [VALUE ...]: the option's value, or a one-line error if it has none
    [ -n "${2:-}" ] || die "$1 needs a value"
    echo "$2"
}

# "1-3,7" -> "1 2 3 7"
expand_seeds() {
    local part out=()
    IFS=, read -r -a parts <<<"$1"
    for part in "${parts[@]}"; do
        if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -le "${BASH_REMATCH[2]}" ]; then
            # shellcheck disable=SC2207  # seq prints numbers only
            out+=($(seq "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"))
        elif [[ $part =~ ^[0-9]+$ ]]; then
            out+=("$((10#$part))")  # 01 is seed 1, as tdmpc.train reads it: named twice with 1
        else
            die "--seeds: '$part' is not a seed or a range like 1-3"
        fi
    done
    echo "${out[*]}"
}

tasks="" seeds="" name=tdmpc max_parallel="" dry_run=0 sbatch_opts=()
while [ $# -gt 0 ]; do
    case $1 in
        --tasks) tasks=$(value "$@"); shift 2 ;;
        --tasks=*) tasks=${1#*=}; shift ;;
        --seeds) seeds=$(value "$@"); shift 2 ;;
        --seeds=*) seeds=${1#*=}; shift ;;
        --name | --job-name | -J) name=$(value "$@"); shift 2 ;;
        --name=* | --job-name=*) name=${1#*=}; shift ;;
        --max-parallel) max_parallel=$(value "$@"); shift 2 ;;
        --max-parallel=*) max_parallel=${1#*=}; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        --array* | -a) die "$1: the array is made from --tasks and --seeds" ;;
        *) sbatch_opts+=("$1"); shift ;;
    esac
done
train_args=("$@")
[ -n "$tasks" ] || die "--tasks is required (e.g. --tasks walker-walk,cheetah-run)"
[ -n "$seeds" ] || die "--seeds is required (e.g. --seeds 1-3)"
[ -z "$max_parallel" ] || [[ $max_parallel =~ ^[1-9][0-9]*$ ]] || die "--max-parallel needs a positive number"
IFS=, read -r -a task_list <<<"$tasks"
seed_words=$(expand_seeds "$seeds")  # a separate assignment, so that its die stops the script
read -r -a seed_list <<<"$seed_words"
for t in "${task_list[@]}"; do
    [[ -n $t && $t != *[[:space:]]* ]] || die "--tasks: empty or blank task name in '$tasks'"
done
for list in "tasks:${task_list[*]}" "seeds:${seed_list[*]}"; do  # a repeat would give two elements one run directory
    twice=$(tr ' ' '\n' <<<"${list#*:}" | sort | uniq -d | head -n 1)
    [ -z "$twice" ] || die "--${list%%:*} names $twice twice: two array elements would train in one run directory"
done
# The tasks and the train flags as every element's tdmpc.train will read them, once here: a typo is one line now,
# not a failure of every element after it waited in the queue. stdout is dropped: the check prints only errors.
python=${TDMPC_PYTHON:-python3}
check_rc=0
sbatch_names=()  # the options before --, by name: a train flag put there by mistake is refused
for opt in "${sbatch_opts[@]}"; do
    [[ $opt != --?* ]] || { opt=${opt#--}; sbatch_names+=("${opt%%=*}"); }
done
check=$("$python" -m tdmpc.slurm_scripts --check-sweep "${task_list[@]}" \
    ${sbatch_names[@]+--sbatch-options "${sbatch_names[@]}"} -- "${train_args[@]}" 2>&1 >/dev/null) || check_rc=$?
last=${check##*$'\n'}  # its one-line error comes last (after any warning)
if [ "$check_rc" = 2 ]; then
    echo "$last" >&2
    exit 2
elif [ "$check_rc" != 0 ]; then
    die "could not check the train arguments: $python -m tdmpc.slurm_scripts exited with code $check_rc${last:+ ($last)};" \
        "run sweep.sh where tdmpc is installed (activate its environment, or set TDMPC_PYTHON)"
fi
n=$((${#task_list[@]} * ${#seed_list[@]}))

# train.sh reads the lists from its environment (sbatch passes the submitter's environment
# on, and keeps it for requeues); spaces separate them, since task ids may hold ':'.
export TDMPC_SWEEP_TASKS="${task_list[*]}" TDMPC_SWEEP_SEEDS="${seed_list[*]}"
# Logs under slurm/logs/ of the directory the sweep is submitted from, as train.sh's own (#SBATCH --output): never
# beside a packaged script (in site-packages, say).
logs=$PWD/slurm/logs
cmd=(sbatch --parsable --job-name="$name" --array="0-$((n - 1))${max_parallel:+%$max_parallel}"
     --output="$logs/%x-%A_%a.out" "${sbatch_opts[@]}" "$here/train.sh" "${train_args[@]}")

# What each element runs and where it writes (the same rule as train.sh).
show_runs() {  # array job id
    local i task seed
    for ((i = 0; i < n; i++)); do
        task=${task_list[i / ${#seed_list[@]}]}
        seed=${seed_list[i % ${#seed_list[@]}]}
        printf '  %s_%-3s %-20s seed %-4s %s\n' "$1" "$i" "$task" "$seed" \
            "${TDMPC_RUN_DIR:-${TDMPC_RUNS:-runs}/slurm/$name/$1}/$task/seed$seed"
    done
    echo "logs: $logs/$name-${1}_<index>.out"
}

if [ "$dry_run" = 1 ]; then
    echo "would run:"
    printf 'TDMPC_SWEEP_TASKS=%q TDMPC_SWEEP_SEEDS=%q' "$TDMPC_SWEEP_TASKS" "$TDMPC_SWEEP_SEEDS"
    printf ' %q' "${cmd[@]}"
    echo
    echo "$n runs (${#task_list[@]} tasks x ${#seed_list[@]} seeds):"
    show_runs "<jobid>"
    exit 0
fi

mkdir -p "$logs"
job=$("${cmd[@]}")
job=${job%%;*}  # --parsable prints "id" or "id;cluster"
echo "submitted array job $job: $n runs (${#task_list[@]} tasks x ${#seed_list[@]} seeds)"
show_runs "$job"
