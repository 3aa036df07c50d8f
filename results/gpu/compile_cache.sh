# Sourced by learning_run.sh and device_run.sh: inductor's cache carried from one lease to the next (issues 55
# and 56), so no lease compiles the same graphs twice. What a lease compiled comes back as
# $OUT/compile-cache.tar.xz; committed as results/gpu/compile-cache.tar.xz, it travels with the tree and the next
# lease unpacks it. Inductor's graph entries hold their Triton kernels (its bundler, on by default), so triton/
# stays behind, and TRITON_STORE_BINARY_ONLY keeps only the kernels' binaries (no PTX or LLVM IR): what fits a
# returned file. The cache is keyed by torch, Triton, the GPU's name and each graph: a miss only compiles.
#
#   use_compile_cache DIR NOTES: inductor's cache in DIR (from CACHE_IN, default the committed tar, unless DIR
#                                exists: a warm machine keeps its own); a line in the file NOTES
#   pack_compile_cache: DIR packed into $OUT (in 15 MiB parts over 16 MiB: cat them back together)
use_compile_cache() {
  COMPILE_CACHE=$1 COMPILE_CACHE_NOTES=$2
  local tar=${CACHE_IN:-$(ls results/gpu/compile-cache.tar.* 2>/dev/null | head -n 1)}
  export TORCHINDUCTOR_CACHE_DIR=$COMPILE_CACHE TRITON_STORE_BINARY_ONLY=1
  if [ ! -d "$COMPILE_CACHE" ] && [ -n "$tar" ] && [ -f "$tar" ]; then
    mkdir -p "$COMPILE_CACHE" && tar -xf "$tar" -C "$COMPILE_CACHE" &&
      echo "compile cache from $tar: $(du -sh "$COMPILE_CACHE" | cut -f1)" >> "$COMPILE_CACHE_NOTES"
  fi
}
pack_compile_cache() {
  [ -d "${COMPILE_CACHE:-}" ] || return 0
  local z=xz size packed; command -v xz > /dev/null || z=gzip  # tar -xf reads either
  packed=$(dirname "$COMPILE_CACHE")/compile-cache.tar.$z
  timeout 20 tar -cf - -C "$COMPILE_CACHE" --exclude=./triton --exclude='*.lock' --exclude='tmp*' . | $z -6 > "$packed"
  size=$(stat -c %s "$packed")
  echo "compile cache: $(du -sh --exclude=triton "$COMPILE_CACHE" | cut -f1) in $COMPILE_CACHE (less triton/)," \
       "$size bytes packed" >> "$COMPILE_CACHE_NOTES"
  if (( size < 16 * 1024 * 1024 - 65536 )); then cp "$packed" "$OUT/"
  else split -b 15M -d "$packed" "$OUT/$(basename "$packed").part-"; fi
}
