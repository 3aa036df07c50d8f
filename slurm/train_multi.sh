#!/usr/bin/env bash
#SBATCH --job-name=tdmpc-multi
#SBATCH --output=slurm/logs/%x-%j.out
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8
#SBATCH --mem=128G
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#
# Data-parallel offline training across GPUs and nodes: one rank per Slurm task (one task per
# GPU), started by srun with the rendezvous read from the Slurm environment (the job's first
# node). Submit from the repository root, or from a directory made by
#   python -m tdmpc.slurm_scripts --copy DIR
#
#   sbatch slurm/train_multi.sh --dataset data/*.h5 --task mt30 --model-size 48 --batch-size 1024
#   sbatch --nodes=1 --ntasks-per-node=2 slurm/train_multi.sh --dataset walker.h5 --task walker-walk
#
# --batch-size is per rank: the global batch is ranks x batch_size. Everything else is
# slurm/train.sh, which this hands over to: its run directory ($TDMPC_RUNS/slurm/<job name>/<job id>),
# its environment variables (TDMPC_SETUP, TDMPC_VENV, ...), and its requeue on USR1 and on TERM from
# a time limit or a preemption, after which every rank resumes from the last checkpoint.
set -euo pipefail
[ -n "${SLURM_JOB_ID:-}" ] || { echo "not inside a Slurm job; submit it: sbatch slurm/train_multi.sh [train args]" >&2; exit 2; }
exec bash "${SLURM_SUBMIT_DIR:?}/slurm/train.sh" "$@"
