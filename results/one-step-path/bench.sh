#!/bin/bash
# Issue 53, point 1: the numpy path end to end before (eb8d28a: two step paths) and after (one step path), in
# the same run, alternating, twice. Each side is a commit installed on its own (so that editing the checkout
# meanwhile changes neither):
#   git worktree add /tmp/before eb8d28a && pip install --no-deps --no-build-isolation --target /tmp/before_site /tmp/before
#   git worktree add /tmp/after <commit> && pip install --no-deps --no-build-isolation --target /tmp/after_site /tmp/after
# Runs from /tmp so that the checkout's tdmpc/ does not shadow either install.
set -euo pipefail
R=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$R/results/one-step-path}  # later comparisons name their own folder
BEFORE_SITE=${BEFORE_SITE:-/tmp/before_site}
AFTER_SITE=${AFTER_SITE:-/tmp/after_site}
E2E="--quick --device cpu --threads 2 --sizes 1 --envs 1 --task Pendulum-v1 --e2e-envs 1 8 --e2e-steps 100 --rss-steps 0 --offline-updates 0"
cd /tmp
echo "before: $(git -C /tmp/before rev-parse --short HEAD), after: $(git -C /tmp/after rev-parse --short HEAD)" > "$OUT/commits.txt"
for round in $(seq 1 ${ROUNDS:-2}); do
  for which in before after; do
    site=$([ "$which" = before ] && echo "$BEFORE_SITE" || echo "$AFTER_SITE")
    echo "== round $round, $which: end to end" >&2
    PYTHONPATH=$site python -m tdmpc.bench $E2E --out "$OUT/e2e-$which-$round.json" > "$OUT/e2e-$which-$round.txt"
    [ -n "${NO_PATHS:-}" ] && continue
    echo "== round $round, $which: 64 and 256 envs (--tensor-envs: both paths)" >&2
    PYTHONPATH=$site python -m tdmpc.bench --tensor-envs --quick --device cpu --threads 1 \
      --tensor-envs-out "$OUT/paths-$which-$round.json" > "$OUT/paths-$which-$round.txt"
  done
done
