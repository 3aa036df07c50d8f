#!/usr/bin/env bash
# Repacks .devsite/site.tar.gz (../shared/tools/device_bundle.sh) without PyOpenGL and labmaze, for leases that run
# state tasks only: under MUJOCO_GL=glfw dm_control's suite imports neither (a cheetah-run run with both imports
# blocked trains: results/gpu/README.md), and the bundle drops from about 31 to 24 MB, room for the compile cache
# (compile-cache.tar.*) within the 64 MiB that travel. Pixel runs need PyOpenGL for EGL: keep the full bundle.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar -xzf .devsite/site.tar.gz -C "$work"
rm -rf "$work"/OpenGL "$work"/pyopengl-*.dist-info "$work"/labmaze "$work"/labmaze-*.dist-info
tar -czf .devsite/site.tar.gz.new -C "$work" . && mv .devsite/site.tar.gz.new .devsite/site.tar.gz
du -h .devsite/site.tar.gz
