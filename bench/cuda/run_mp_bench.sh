#!/usr/bin/env bash
# Mixed precision on an NVIDIA GPU in one command: the samples' training step with [precision] compute = "float32",
# "bfloat16" and "float16" (Kiln, CUDA graphs on), against PyTorch's autocast in the same types, and the GEMM rate of
# each storage type. Writes bench/results/cuda_mp_<gpu>.txt (it starts with the commands that made it).
#   bench/cuda/run_mp_bench.sh [build-dir]       on the GPU machine, with a build that has the CUDA backend
#   [KILN_OUT=DIR] bench/cuda/run_mp_bench.sh --carried
#                                                a build packed by bench/cuda/pack_for_gpu.sh (bench/cuda/gpu_env.sh)
# Rows per sample and batch: kiln float32 / bfloat16 / float16, then torch FP32 / autocast bf16 (CUDA graph) and
# autocast f16 (eager, GradScaler). bfloat16 needs compute capability 8.0 (Ampere), float16 7.0; a device that
# lacks one says so in its rows. run_gpu_bench.sh runs this too. --profile rows (per-op device time) for bfloat16:
#   KILN_MP_PROFILE=1 bench/cuda/run_mp_bench.sh
# Environment: PYTHON, the Python with PyTorch for CUDA (default python3); KILN_FASHION_MNIST (bench/common.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if [ "${1:-}" = "--carried" ]; then
  source bench/cuda/gpu_env.sh
  B="$KILN_B"
elif [ -n "${1:-}" ]; then
  B="$1"
else
  B=build
  cuda_plugin=lib/kiln/cuda/libkiln_cuda_impl.so
  [ ! -f "build/$cuda_plugin" ] && [ -f "build-cuda/$cuda_plugin" ] && B=build-cuda
fi
source bench/common.sh
for t in kiln_cuda_gemm_bench kiln_step_bench; do
  [ -x "$B/bin/$t" ] || { echo "run_mp_bench: no $B/bin/$t: build first (./setup.sh build, or cmake --build $B)" >&2; exit 2; }
done
[ -f "$B/lib/kiln/cuda/libkiln_cuda_impl.so" ] || {
  echo "run_mp_bench: $B has no CUDA backend: build where the CUDA toolkit is (cmake --preset cuda)" >&2; exit 2; }
OUT=bench/results
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '_' | tr -d '\n')
gpu=${gpu:-unknown_gpu}
header() { echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $gpu, commit $(git rev-parse --short HEAD 2>/dev/null)"; \
           nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/# /'; }
run() { echo "\$ $*"; "$@" 2>&1; echo "(exit $?)"; }

torch_ok=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
{ header
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20 --dtype bfloat16
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20 --dtype float16
  for spec in "mlp samples/fashion_mnist_mlp.toml 32 500" "mlp samples/fashion_mnist_mlp.toml 512 300" \
              "cnn samples/fashion_mnist_cnn.toml 64 200" "cnn samples/fashion_mnist_cnn.toml 512 100"; do
    set -- $spec
    kind=$1 cfg=$2 batch=$3 steps=$4
    mapfile -t ds < <(data_sets "$cfg")
    for p in float32 bfloat16 float16; do
      run "$B/bin/kiln_step_bench" "$cfg" "${ds[@]}" --set device.backend=cuda --set train.batch_size=$batch \
        --set "precision.compute=\"$p\"" --steps "$steps"
    done
    if [ -n "${KILN_MP_PROFILE:-}" ]; then
      run "$B/bin/kiln_step_bench" "$cfg" "${ds[@]}" --set device.backend=cuda --set train.batch_size=$batch \
        --set 'precision.compute="bfloat16"' --steps "$steps" --profile
    fi
    if [ "$torch_ok" = "1" ]; then
      run "$PY" bench/cuda/torch_step_cuda.py "$kind" "$batch" "$steps" --graphs
      run "$PY" bench/cuda/torch_step_cuda.py "$kind" "$batch" "$steps" --graphs --amp=bf16
      run "$PY" bench/cuda/torch_step_cuda.py "$kind" "$batch" "$steps" --amp=f16
    else
      echo "pytorch with CUDA is not available to $PY: no PyTorch comparison on this machine"
    fi
  done
} > "$OUT/cuda_mp_$gpu.txt"
cat "$OUT/cuda_mp_$gpu.txt"
if [ -n "${KILN_OUT:-}" ]; then cp "$OUT/cuda_mp_$gpu.txt" "$KILN_OUT"/ 2>/dev/null; fi
