# Sourced by learning_run.sh and device_run.sh: inductor's cache carried from one lease to the next (issues 55
# and 56), so no lease compiles the same graphs twice. What a lease compiled comes back as
# $OUT/compile-cache.tar.xz when it can travel in again; committed as results/gpu/compile-cache.tar.xz, it goes
# with the tree and the next lease unpacks it. Inductor's graph entries hold their Triton kernels (its bundler, on
# by default), so triton/ stays behind, and TRITON_STORE_BINARY_ONLY keeps only the kernels' binaries (no PTX or
# LLVM IR). The cache is keyed by torch, Triton, the GPU's name and each graph: a miss only compiles.
#
#   use_compile_cache DIR NOTES: inductor's cache in DIR, from CACHE_IN (default: the committed tar) unless DIR
#                                exists (a warm machine keeps its own); what happened, a line in the file NOTES
#   pack_compile_cache: DIR packed into $OUT if it fits beside the tree, the full bundle and .gl (64 MiB travel)
COMPILE_CACHE_TAR=results/gpu/compile-cache.tar.xz
use_compile_cache() {
  COMPILE_CACHE=$1 COMPILE_CACHE_NOTES=$2 COMPILE_CACHE_ROOT=$PWD  # called from the checkout's root
  local tar=${CACHE_IN:-$COMPILE_CACHE_TAR} tmp
  export TORCHINDUCTOR_CACHE_DIR=$COMPILE_CACHE TRITON_STORE_BINARY_ONLY=1
  [ ! -d "$COMPILE_CACHE" ] && [ -f "$tar" ] || return 0
  mkdir -p "$(dirname "$COMPILE_CACHE")"
  tmp=$(mktemp -d "$COMPILE_CACHE.in.XXXX")  # whole or not at all: a cut archive must not leave half a cache
  if tar -xf "$tar" -C "$tmp"; then
    mv "$tmp" "$COMPILE_CACHE" && echo "compile cache from $tar: $(du -sh "$COMPILE_CACHE" | cut -f1)" >> "$COMPILE_CACHE_NOTES"
  else
    rm -rf "$tmp"; echo "compile cache from $tar: unreadable, compiling cold" >> "$COMPILE_CACHE_NOTES"
  fi
}
pack_compile_cache() {
  [ -d "${COMPILE_CACHE:-}" ] || return 0
  local packed=$COMPILE_CACHE.tar.xz tree room size
  # What travels in besides it: the tree less the committed cache, and .devsite/ and .gl/ at their largest (the
  # pixel leases' full bundle, 31.2 MB, and the EGL packages), so a committed cache never pushes a lease over.
  if git -C "$COMPILE_CACHE_ROOT" rev-parse 2> /dev/null; then  # a checkout (a rehearsal): its tracked files
    tree=$(cd "$COMPILE_CACHE_ROOT" && git ls-files -z | grep -zvx "$COMPILE_CACHE_TAR" | xargs -0 du -cb | tail -n 1 | cut -f1)
  else  # the device's copy: what travelled
    tree=$(du -sb --exclude=.devsite --exclude=.gl --exclude="$(basename $COMPILE_CACHE_TAR)" "$COMPILE_CACHE_ROOT" | cut -f1)
  fi
  room=$(( 64 * 1024 * 1024 - tree - 32 * 1000 * 1000 - 1024 * 1024 ))
  if ! timeout 60 bash -o pipefail -c "tar -cf - -C '$COMPILE_CACHE' --exclude=./triton --exclude='*.lock' \
       --exclude='tmp*' . | xz -T0 -3 > '$packed.tmp'"; then
    rm -f "$packed.tmp"; echo "compile cache: packing failed or took over 60 s; not returned" >> "$COMPILE_CACHE_NOTES"
    return 0
  fi
  mv "$packed.tmp" "$packed"; size=$(stat -c %s "$packed")
  echo "compile cache: $(du -sh --exclude=triton "$COMPILE_CACHE" | cut -f1) in $COMPILE_CACHE (less triton/)," \
       "$size bytes packed, room to travel $room bytes" >> "$COMPILE_CACHE_NOTES"
  if (( size <= room )); then cp "$packed" "$OUT/$(basename $COMPILE_CACHE_TAR)"
  else echo "compile cache: too large to travel in with this tree; not returned" >> "$COMPILE_CACHE_NOTES"; fi
}
