#!/usr/bin/env bash
# For a GPU machine that cannot build Kiln (no CUDA toolkit): packs a build with the CUDA backend made on another
# machine into .gpu/ (git-ignored, ~15 MiB). On a GPU machine with the toolkit, build there instead and run
# bench/cuda/run_gpu_bench.sh directly.
#   .gpu/build/{bin,lib,share}  the built programs, core library and plugins (no object files)
#   .gpu/deps/                  the Debian shared libraries they link that a bare GPU machine may lack
# CUDA's own libraries are not packed: the GPU machine has them in PyTorch's pip packages (bench/cuda/gpu_env.sh).
# The build tree's RPATHs and compiled-in paths are absolute, so on the GPU machine gpu_env.sh links
# $BUILD_DIR_ABS (this machine's absolute build path) to .gpu/build.
#   bench/cuda/pack_for_gpu.sh [--data] [build-dir]
#     then copy the repository with .gpu/ to the GPU machine and run there, from its root:
#     [KILN_OUT=DIR] bench/cuda/run_gpu_bench.sh --carried
# --data packs Fashion-MNIST ($KILN_FASHION_MNIST, 30 MiB, for the accuracy runs on the GPU) instead of the CPU
# plugin's oneDNN, OpenBLAS and Fortran runtime (about 75 MiB), which keeps .gpu/ near 50 MiB for a copy limited to
# 64 MiB. The CPU plugin then does not load on the GPU machine (the loader reports it and goes on); the CUDA and
# Vulkan backends do not need it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
DATA=0
if [ "${1:-}" = "--data" ]; then DATA=1; shift; fi
B="${1:-build}"
[ -x "$B/bin/kiln" ] || { echo "pack_for_gpu: $B/bin/kiln not found; build first (cmake --build $B)" >&2; exit 2; }
# The GPU machine has another CPU: a CPU backend built for this one (KILN_ARCH=native) may not run there.
if grep -q '^KILN_ARCH:STRING=native$' "$B/CMakeCache.txt" 2>/dev/null; then
  echo "pack_for_gpu: $B was configured with KILN_ARCH=native (this machine's CPU); reconfigure with" \
    "-DKILN_ARCH=x86-64-v3 (or empty) so the CPU backend runs on the GPU machine's CPU" >&2
  exit 2
fi
[ -f "$B/lib/kiln/cuda/libkiln_cuda_impl.so" ] || { echo "pack_for_gpu: $B has no CUDA backend (configure with -DKILN_WITH_CUDA=ON)" >&2; exit 2; }
rm -rf .gpu && mkdir -p .gpu/build .gpu/deps
cp -a "$B/bin" "$B/lib" .gpu/build/
[ -d "$B/share" ] && cp -a "$B/share" .gpu/build/
rm -f .gpu/build/bin/*.log
(cd "$B" && pwd) > .gpu/build_dir
# Every non-system, non-CUDA library the binaries and plugins need.
ldd .gpu/build/bin/* .gpu/build/lib/*.so* .gpu/build/lib/kiln/*.so .gpu/build/lib/kiln/cuda/*.so 2>/dev/null |
  awk '/=> \// {print $3}' | sort -u |
  grep -v -e "/work/" -e "$(cd "$B" && pwd)" -e '/cuda/' -e 'libc\.so' -e 'libm\.so' -e 'libgcc_s' -e 'libstdc++' \
          -e 'ld-linux' -e 'libpthread' -e 'libdl\.so' -e 'librt\.so' |
  while read -r lib; do
    if [ "$DATA" = 1 ] && [[ "$lib" =~ openblas|gfortran|quadmath|dnnl ]]; then continue; fi
    cp -L "$lib" .gpu/deps/
  done
if [ "$DATA" = 1 ]; then
  mkdir -p .gpu/data/fashion-mnist
  cp "$KILN_FASHION_MNIST"/*.gz .gpu/data/fashion-mnist/
fi
du -sh .gpu | sed 's/^/pack_for_gpu: /'
ls .gpu/deps
