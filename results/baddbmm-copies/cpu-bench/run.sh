#!/usr/bin/env bash
# alternate before/after bench --quick, 2 rounds, on the idle machine
cd /tmp/qb
source /work/main/.venv/bin/activate
for i in 1 2; do
  PYTHONPATH=/tmp/before_site python -m tdmpc.bench --quick --device cpu --threads 2 --out /tmp/qb/before-$i.json > /tmp/qb/before-$i.log 2>&1
  python -m tdmpc.bench --quick --device cpu --threads 2 --out /tmp/qb/after-$i.json > /tmp/qb/after-$i.log 2>&1
done
echo done > /tmp/qb/finished
