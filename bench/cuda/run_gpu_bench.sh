#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks, for a machine with an NVIDIA GPU (they cannot run without one).
# Builds Kiln with CUDA required, then writes to bench/results/ (each file starts with the commands that made it):
#   cuda_tests_<gpu>.txt        the [cuda] unit tests (ops against the reference, graphs, NCCL, OOM, copies)
#   cuda_nccl_mpi_<gpu>.txt     NCCL across 2 MPI ranks against one process (the [mpi][cuda] integration test; it
#                               skips without mpirun or with fewer than 2 GPUs, after checking what 1 GPU allows)
#   cuda_conformance_<gpu>.json `kiln conformance --backend cuda` (the shared op table)
#   cuda_gemm_<gpu>.txt         GEMM TFLOP/s (FP32 and TF32) and per-op launch cost eager vs CUDA graph
#   cuda_step_<gpu>.txt         training step of the samples: Kiln (graphs on/off) against PyTorch (eager/graph)
#   cuda_accuracy_<gpu>.txt     both samples trained on the GPU (when Fashion-MNIST is there)
#   vulkan_gpu_<gpu>.txt        the Vulkan backend on the same GPU (NVIDIA's Vulkan driver), same steps
# usage: bench/cuda/run_gpu_bench.sh [build-dir]   builds there (default build-gpu; needs the CUDA toolkit and cmake)
#        KILN_OUT=$OUT bench/cuda/run_gpu_bench.sh --carried
#            uses a build packed here by bench/cuda/pack_for_gpu.sh and carried as .gpu (the device tool's carry),
#            and copies the result files to $KILN_OUT (the device tool's $OUT) so they come back
set -uo pipefail
cd "$(dirname "$0")/../.."
CARRIED=0
if [ "${1:-}" = "--carried" ]; then
  CARRIED=1
  source bench/cuda/gpu_env.sh
  B="$KILN_B"
else
  B="${1:-build-gpu}"
fi
OUT=bench/results
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '_' | tr -d '\n')
gpu=${gpu:-unknown_gpu}
PY=${PYTHON:-python3}

if [ "$CARRIED" = 0 ]; then
  set -e
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=ON
  cmake --build "$B" -j"$(nproc)" --target kiln kiln_cuda kiln_unit_tests kiln_integration_tests kiln_cuda_gemm_bench kiln_step_bench
  set +e
fi
"$B/bin/kiln" devices 2>&1 | head -20

header() { echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $gpu, commit $(git rev-parse --short HEAD 2>/dev/null)"; \
           nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/# /'; }
run() { echo "\$ $*"; "$@" 2>&1; echo "(exit $?)"; }

{ header; run "$B/bin/kiln_unit_tests" "[cuda]" -s -r compact; run "$B/bin/kiln_unit_tests" "[cuda]"; } \
  > "$OUT/cuda_tests_$gpu.txt"
tail -3 "$OUT/cuda_tests_$gpu.txt"

# NCCL across processes: communicator "nccl" over process group "mpi", one GPU per rank.
{ header; run "$B/bin/kiln_integration_tests" "[mpi][cuda]" -s -r compact; } > "$OUT/cuda_nccl_mpi_$gpu.txt"
tail -3 "$OUT/cuda_nccl_mpi_$gpu.txt"

"$B/bin/kiln" conformance --backend cuda --report "$OUT/cuda_conformance_$gpu.json" 2>&1 | tail -5

{ header
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20 --tf32
} > "$OUT/cuda_gemm_$gpu.txt"
cat "$OUT/cuda_gemm_$gpu.txt"

torch_ok=$($PY -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
{ header
  # The sizes the CUDA issue names: MLP batch 32 and 512, CNN batch 64 and 512.
  for spec in "mlp samples/fashion_mnist_mlp.toml 32 500" "mlp samples/fashion_mnist_mlp.toml 512 300" \
              "cnn samples/fashion_mnist_cnn.toml 64 200" "cnn samples/fashion_mnist_cnn.toml 512 100"; do
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

# Both samples trained on the GPU (needs /usr/share/datasets/fashion-mnist: pack_for_gpu.sh --data).
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  { header
    run "$B/bin/kiln" train samples/fashion_mnist_mlp.toml --overwrite --set device.backend=cuda --set 'train.progress="lines"' \
      --set 'train.output_dir="/tmp/kiln-gpu-mlp"'
    run "$B/bin/kiln" train samples/fashion_mnist_cnn.toml --overwrite --set device.backend=cuda --set 'train.progress="lines"' \
      --set 'train.output_dir="/tmp/kiln-gpu-cnn"'
  } > "$OUT/cuda_accuracy_$gpu.txt"
  grep -E "^done|^\(exit" "$OUT/cuda_accuracy_$gpu.txt"
else
  echo "no Fashion-MNIST on this machine: no accuracy runs (pack with bench/cuda/pack_for_gpu.sh --data)"
fi

# The Vulkan backend on the same GPU, same steps (ratios against the CUDA rows above).
{ header
  run "$B/bin/kiln" devices --backend vulkan
  for spec in "samples/fashion_mnist_mlp.toml 32 300" "samples/fashion_mnist_mlp.toml 512 200" \
              "samples/fashion_mnist_cnn.toml 64 100" "samples/fashion_mnist_cnn.toml 512 50"; do
    set -- $spec
    run "$B/bin/kiln_step_bench" "$1" --set device.backend=vulkan --set train.batch_size=$2 --steps "$3"
  done
} > "$OUT/vulkan_gpu_$gpu.txt"
cat "$OUT/vulkan_gpu_$gpu.txt"

if [ "$CARRIED" = 1 ] && [ -n "${KILN_OUT:-}" ]; then cp "$OUT"/cuda_*_"$gpu".* "$OUT"/vulkan_gpu_"$gpu".txt "$KILN_OUT"/ 2>/dev/null; fi
