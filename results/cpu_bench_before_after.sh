#!/usr/bin/env bash
# bench --quick before and after a change, alternating, on the idle machine (2 threads):
#   results/cpu_bench_before_after.sh BEFORE_SITE OUT_DIR [ROUNDS]
# BEFORE_SITE: the earlier commit installed apart, e.g.
#   git worktree add /tmp/before <commit>
#   pip install --no-deps --no-build-isolation --target /tmp/before_site /tmp/before
# after: the package the active environment imports. Writes OUT_DIR/{before,after}-N.{json,log}.
set -eu
before=$1 out=$2 rounds=${3:-2}
mkdir -p "$out"
for i in $(seq "$rounds"); do
  PYTHONPATH=$before python -m tdmpc.bench --quick --device cpu --threads 2 --out "$out/before-$i.json" > "$out/before-$i.log" 2>&1
  python -m tdmpc.bench --quick --device cpu --threads 2 --out "$out/after-$i.json" > "$out/after-$i.log" 2>&1
done
