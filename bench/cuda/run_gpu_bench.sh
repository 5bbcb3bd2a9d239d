#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks, for a machine with an NVIDIA GPU (they cannot run without one).
# Builds Kiln with CUDA required, then writes to bench/results/ (each file starts with the commands that made it):
#   cuda_tests_<gpu>.txt        the [cuda] unit tests (ops against the reference, graphs, NCCL, OOM, copies)
#   cuda_conformance_<gpu>.json `kiln conformance --backend cuda` (the shared op table)
#   cuda_gemm_<gpu>.txt         GEMM TFLOP/s (FP32 and TF32) and per-op launch cost eager vs CUDA graph
#   cuda_step_<gpu>.txt         training step of the samples: Kiln (graphs on/off) against PyTorch (eager/graph)
# usage: bench/cuda/run_gpu_bench.sh [build-dir]      (default build-gpu; uses every core for the build)
set -uo pipefail
cd "$(dirname "$0")/../.."
B="${1:-build-gpu}"
OUT=bench/results
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '_' | tr -d '\n')
gpu=${gpu:-unknown_gpu}
PY=${PYTHON:-python3}

set -e
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=ON
cmake --build "$B" -j"$(nproc)" --target kiln kiln_cuda kiln_unit_tests kiln_cuda_gemm_bench kiln_step_bench
set +e

header() { echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $gpu, commit $(git rev-parse --short HEAD 2>/dev/null)"; \
           nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/# /'; }
run() { echo "\$ $*"; "$@" 2>&1; echo "(exit $?)"; }

{ header; run "$B/bin/kiln_unit_tests" "[cuda]" -s -r compact; run "$B/bin/kiln_unit_tests" "[cuda]"; } \
  > "$OUT/cuda_tests_$gpu.txt"
tail -3 "$OUT/cuda_tests_$gpu.txt"

"$B/bin/kiln" conformance --backend cuda --report "$OUT/cuda_conformance_$gpu.json" 2>&1 | tail -5

{ header
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20 --tf32
} > "$OUT/cuda_gemm_$gpu.txt"
cat "$OUT/cuda_gemm_$gpu.txt"

torch_ok=$($PY -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
{ header
  for spec in "mlp samples/fashion_mnist_mlp.toml 128 300" "mlp samples/fashion_mnist_mlp.toml 1024 200" \
              "cnn samples/fashion_mnist_cnn.toml 64 200" "cnn samples/fashion_mnist_cnn.toml 256 100"; do
    set -- $spec
    kind=$1 cfg=$2 batch=$3 steps=$4
    run "$B/bin/kiln_step_bench" "$cfg" --set device.backend=cuda --set train.batch_size=$batch --steps "$steps"
    run env KILN_CUDA_GRAPHS=0 "$B/bin/kiln_step_bench" "$cfg" --set device.backend=cuda \
      --set train.batch_size=$batch --steps "$steps"
    if [ "$torch_ok" = "1" ]; then
      run $PY bench/cuda/torch_step_cuda.py "$kind" "$batch" "$steps"
      run $PY bench/cuda/torch_step_cuda.py "$kind" "$batch" "$steps" --graphs
    else
      echo "pytorch with CUDA is not available to $PY: no PyTorch comparison on this machine"
    fi
  done
} > "$OUT/cuda_step_$gpu.txt"
cat "$OUT/cuda_step_$gpu.txt"
