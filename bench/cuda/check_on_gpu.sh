#!/usr/bin/env bash
# The CUDA backend's correctness checks only (a few minutes; run_gpu_bench.sh adds the benchmarks): the [cuda] unit
# tests, the kernel-completeness test, and `kiln conformance --backend cuda` over the whole op table.
#   bench/cuda/check_on_gpu.sh [build-dir]      on a GPU machine with a build that has the CUDA backend
#   bench/cuda/check_on_gpu.sh --carried        with a build packed by bench/cuda/pack_for_gpu.sh (gpu_env.sh)
# KILN_OUT=DIR: where the logs go (default bench/results/gpu-check); each log starts with the command that made it.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = "--carried" ]; then
  source bench/cuda/gpu_env.sh
  B="$KILN_B"
else
  B=${1:-build}
fi
out=${KILN_OUT:-bench/results/gpu-check}
mkdir -p "$out"
for t in kiln kiln_unit_tests kiln_conformance_tests; do
  [ -x "$B/bin/$t" ] || { echo "check_on_gpu: no $B/bin/$t: build first" >&2; exit 2; }
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
run() { local log=$1; shift; { echo "\$ $*"; "$@"; echo "(exit $?)"; } >"$out/$log" 2>&1; tail -4 "$out/$log"; }
run devices.txt "$B/bin/kiln" devices
run unit_cuda.txt "$B/bin/kiln_unit_tests" "[cuda]"
run kernels.txt "$B/bin/kiln_conformance_tests" "[kernels]"
run conformance_cuda.txt "$B/bin/kiln" conformance --backend cuda --report "$out/conformance_cuda.json"
grep -E "^FAIL" "$out/conformance_cuda.txt" | head -20
