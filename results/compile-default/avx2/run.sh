set -e
cd /work/main && source .venv/bin/activate
export TORCHINDUCTOR_CACHE_DIR=/tmp/cd2/inductor  # emptied next: a cold first compile
rm -rf $TORCHINDUCTOR_CACHE_DIR
B="python -m tdmpc.bench --device cpu --threads 2 --sizes 1 --envs 1 --e2e-envs 1 --e2e-steps 100 --warmup-steps 200 --rss-steps 0 --offline-updates 0 --no-compare-plain --task walker-walk"
$B --no-compile --out results/compile-default/avx2/eager.json > results/compile-default/avx2/eager.log 2>&1
$B --compile --out results/compile-default/avx2/comp.json > results/compile-default/avx2/comp.log 2>&1
$B --no-compile --out results/compile-default/avx2/eager2.json > results/compile-default/avx2/eager2.log 2>&1
echo DONE
