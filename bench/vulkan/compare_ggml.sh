#!/usr/bin/env bash
# Kiln's Vulkan GEMM and convolutions against ggml-vulkan's MUL_MAT (FP32), in one run, on the same device.
#
#   bench/lock.sh bench/vulkan/compare_ggml.sh GGML_BUILD_DIR [KILN_BUILD_DIR (default build-vk)] [RUNS (default 3)]
#
# Run it under the build lock (bench/lock.sh) on a shared machine: it is a benchmark. Each run prints the load average,
# then ggml's `test-backend-ops perf -o MUL_MAT -b Vulkan0` on square FP32 products (256, 512, 1024, 2048), then
# `kiln_vulkan_bench --backends vulkan --only gemm` and `--only conv2d`, back to back.
#
# Both sides are measured the same way: test-backend-ops perf times repeated ggml_backend_graph_compute calls of a
# graph holding n = GGML_PERF_TARGET_GFLOP / flops per op + 1 copies of the op (each call records, submits and
# waits) until they add up to at least 1 s, and reports total flops / total time; kiln_vulkan_bench does the same
# with n calls and one synchronize() per batch, with the same target (--target-gflop), so neither side's figure is
# a best case. (kiln_vulkan_bench --best-of N reports the fastest single call instead: not for this comparison.)
#
# ggml is a peer, never vendored into Kiln. To build it (GitHub unreachable; the llama-cpp-python sdist on PyPI
# carries llama.cpp with ggml, ggml-vulkan and tests/test-backend-ops.cpp):
#   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /work/peers/dl   # or fetch the sdist URL
#   tar xzf /work/peers/dl/llama_cpp_python-0.3.36.tar.gz -C /work/peers
#   apt-get install spirv-headers glslc                      # ggml-vulkan's CMake needs SPIRV-Headers' config
#   cd /work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp
#   patch -p1 < KILN/bench/vulkan/ggml_peer.patch
#   cmake -S . -B /work/peers/ggml-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON \
#     -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_EXAMPLES=OFF \
#     -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF
#   nice -n 15 cmake --build /work/peers/ggml-build -j1 --target test-backend-ops
# On a shared machine build it niced and without bench/lock.sh: the lock would hold everyone's Kiln builds back for
# the whole build (13 min at -j1 on the 2-core VM, with ccache; ggml-vulkan compiles a few hundred shaders). llama-cpp-python 0.3.36 carries
# ggml 0.25.3 (commit 0c1e570); a different sdist may need ggml_peer.patch adjusted.
# ggml_peer.patch changes no kernel: (1) test-backend-ops's perf list gets square FP32 x FP32 MUL_MAT cases
# (256..2048; its own list has none); (2) GGML_PERF_TARGET_GFLOP lowers the 100 GFLOP each GPU perf case runs
# (minutes per case on lavapipe; the figure stays total flops / total time over >= 1 s); (3) ggml-vulkan.cpp
# builds against Debian 12's Vulkan headers (1.3.239), which lack VK_EXT_layer_settings (validation-layer options
# only). ggml-vulkan skips CPU-type devices unless named: GGML_VK_VISIBLE_DEVICES=0 selects lavapipe.
set -euo pipefail
ggml=${1:?usage: compare_ggml.sh GGML_BUILD_DIR [KILN_BUILD_DIR] [RUNS]}
kiln=${2:-build-vk}
runs=${3:-3}
tbo="$ggml/bin/test-backend-ops"
if [[ ! -x "$tbo" ]]; then
  echo "no $tbo: build ggml first (see the comment at the top of $0)" >&2
  exit 2
fi
bench="$kiln/bin/kiln_vulkan_bench"
[[ -x "$bench" ]] || { echo "no $bench: build Kiln with Vulkan first" >&2; exit 2; }
sizes='(256|512|1024|2048)'
filter="type_a=f32,type_b=f32,m=$sizes,n=$sizes,k=$sizes,bs=\\[1,1\\],nr=\\[1,1\\]"
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} GGML_PERF_TARGET_GFLOP=${GGML_PERF_TARGET_GFLOP:-4}
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$ggml/CMakeCache.txt" 2>/dev/null || true)
if ! grep -q 'Kiln comparison' "$src/tests/test-backend-ops.cpp" 2>/dev/null; then
  echo "test-backend-ops in $ggml (source ${src:-unknown}) lacks bench/vulkan/ggml_peer.patch: see the top of $0" >&2
  exit 2
fi
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, $runs runs; ggml: $tbo (GGML_PERF_TARGET_GFLOP=$GGML_PERF_TARGET_GFLOP); kiln: $bench"
for ((r = 1; r <= runs; r++)); do
  echo "## run $r, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "### ggml-vulkan test-backend-ops perf -o MUL_MAT -b Vulkan0 (FP32, m = n = k)"
  "$tbo" perf -o MUL_MAT -b Vulkan0 -p "$filter" 2>&1 | grep -E 'MUL_MAT|Device description' | sed 's/\x1b\[[0-9;]*m//g' || true
  for op in gemm conv2d; do
    echo "### kiln_vulkan_bench --backends vulkan --only $op --target-gflop $GGML_PERF_TARGET_GFLOP," \
      "load average $(cut -d' ' -f1-3 /proc/loadavg)"
    "$bench" --backends vulkan --only "$op" --target-gflop "$GGML_PERF_TARGET_GFLOP"
  done
done
echo "## end, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
