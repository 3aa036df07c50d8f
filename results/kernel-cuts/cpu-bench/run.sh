#!/usr/bin/env bash
# Alternate before/after bench --quick, 2 rounds, on the idle machine. before = 7978017 installed apart:
#   git worktree add /tmp/before 7978017
#   pip install --no-deps --no-build-isolation --target /tmp/before_site2 /tmp/before
cd /tmp/qb2
source /work/main/.venv/bin/activate
for i in 1 2; do
  PYTHONPATH=/tmp/before_site2 python -m tdmpc.bench --quick --device cpu --threads 2 --out /tmp/qb2/before-$i.json > /tmp/qb2/before-$i.log 2>&1
  python -m tdmpc.bench --quick --device cpu --threads 2 --out /tmp/qb2/after-$i.json > /tmp/qb2/after-$i.log 2>&1
done
echo done > /tmp/qb2/finished
