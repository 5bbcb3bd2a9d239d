#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks, for a machine with an NVIDIA GPU (they cannot run without one).
# Runs on a build with the CUDA backend and writes to bench/results/ (each file starts with the commands that made it):
#   cuda_tests_<gpu>.txt        the [cuda] unit tests (ops against the reference, graphs, NCCL, OOM, copies)
#   cuda_nccl_mpi_<gpu>.txt     NCCL across 2 MPI ranks against one process (the [mpi][cuda] integration test; it
#                               skips without mpirun or with fewer than 2 GPUs, after checking what 1 GPU allows)
#   cuda_conformance_<gpu>.json `kiln conformance --backend cuda` (the shared op table)
#   cuda_gemm_<gpu>.txt         GEMM TFLOP/s (FP32, TF32, bfloat16, float16) and per-op launch cost eager vs graph
#   cuda_step_<gpu>.txt         training step of the samples: Kiln (graphs on/off) against PyTorch (eager/graph)
#   cuda_accuracy_<gpu>.txt     both samples trained on the GPU (when Fashion-MNIST is there)
#   vulkan_gpu_<gpu>.txt        the Vulkan backend on the same GPU (NVIDIA's Vulkan driver), same steps
#   cuda_mp_<gpu>.txt           mixed precision: the steps in float32/bfloat16/float16 against PyTorch autocast
#                               (bench/cuda/run_mp_bench.sh, which also runs alone: the one command for those rows)
# usage: bench/cuda/run_gpu_bench.sh [build-dir]
#            on the GPU machine, after the README's build (./setup.sh build, or cmake --preset cuda and
#            cmake --build --preset cuda, where the CUDA toolkit is installed); default build, or build-cuda when only
#            that one has the CUDA backend
#        [KILN_OUT=DIR] bench/cuda/run_gpu_bench.sh --carried
#            on a GPU machine without the toolkit: a build packed elsewhere by bench/cuda/pack_for_gpu.sh and copied
#            here as .gpu/ (bench/cuda/gpu_env.sh); KILN_OUT, if set, is a directory the result files are copied to
# Environment: PYTHON, the Python with PyTorch for CUDA (default python3 on the PATH); KILN_FASHION_MNIST
# (bench/common.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
# Here PyTorch for CUDA is usually a pip install on the PATH, not Debian's (bench/common.sh's default).
PY=${PYTHON:-python3}
CARRIED=0
if [ "${1:-}" = "--carried" ]; then
  CARRIED=1
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
for t in kiln kiln_unit_tests kiln_integration_tests kiln_cuda_gemm_bench kiln_step_bench; do
  [ -x "$B/bin/$t" ] || {
    echo "run_gpu_bench: no $B/bin/$t: build first (./setup.sh build, or cmake --build $B)" >&2; exit 2; }
done
[ -f "$B/lib/kiln/cuda/libkiln_cuda_impl.so" ] || {
  echo "run_gpu_bench: $B has no CUDA backend: build where the CUDA toolkit is (cmake --preset cuda)" >&2; exit 2; }
OUT=bench/results
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9\n' '_' | tr -d '\n')
gpu=${gpu:-unknown_gpu}
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
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20 --dtype bfloat16
  run "$B/bin/kiln_cuda_gemm_bench" --iters 20 --dtype float16
} > "$OUT/cuda_gemm_$gpu.txt"
cat "$OUT/cuda_gemm_$gpu.txt"

torch_ok=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
{ header
  # The sizes the CUDA issue names: MLP batch 32 and 512, CNN batch 64 and 512.
  for spec in "mlp samples/fashion_mnist_mlp.toml 32 500" "mlp samples/fashion_mnist_mlp.toml 512 300" \
              "cnn samples/fashion_mnist_cnn.toml 64 200" "cnn samples/fashion_mnist_cnn.toml 512 100"; do
    set -- $spec
    kind=$1 cfg=$2 batch=$3 steps=$4
    mapfile -t ds < <(data_sets "$cfg")
    run "$B/bin/kiln_step_bench" "$cfg" "${ds[@]}" --set device.backend=cuda --set train.batch_size=$batch \
      --steps "$steps"
    run env KILN_CUDA_GRAPHS=0 "$B/bin/kiln_step_bench" "$cfg" "${ds[@]}" --set device.backend=cuda \
      --set train.batch_size=$batch --steps "$steps"
    if [ "$torch_ok" = "1" ]; then
      run "$PY" bench/cuda/torch_step_cuda.py "$kind" "$batch" "$steps"
      run "$PY" bench/cuda/torch_step_cuda.py "$kind" "$batch" "$steps" --graphs
    else
      echo "pytorch with CUDA is not available to $PY: no PyTorch comparison on this machine"
    fi
  done
} > "$OUT/cuda_step_$gpu.txt"
cat "$OUT/cuda_step_$gpu.txt"

# Both samples trained on the GPU (needs Fashion-MNIST in $KILN_FASHION_MNIST; for --carried: pack_for_gpu.sh --data).
if [ -f "$KILN_FASHION_MNIST/train-images-idx3-ubyte.gz" ]; then
  { header
    for s in mlp cnn; do
      mapfile -t ds < <(data_sets "samples/fashion_mnist_$s.toml")
      run "$B/bin/kiln" train "samples/fashion_mnist_$s.toml" "${ds[@]}" --overwrite --set device.backend=cuda \
        --set 'train.progress="lines"' --set "train.output_dir=\"/tmp/kiln-gpu-$s\""
    done
  } > "$OUT/cuda_accuracy_$gpu.txt"
  grep -E "^done|^\(exit" "$OUT/cuda_accuracy_$gpu.txt"
else
  echo "no Fashion-MNIST in $KILN_FASHION_MNIST: no accuracy runs (set KILN_FASHION_MNIST, or for --carried pack" \
    "with bench/cuda/pack_for_gpu.sh --data)"
fi

# The Vulkan backend on the same GPU, same steps (ratios against the CUDA rows above).
{ header
  run "$B/bin/kiln" devices --backend vulkan
  for spec in "samples/fashion_mnist_mlp.toml 32 300" "samples/fashion_mnist_mlp.toml 512 200" \
              "samples/fashion_mnist_cnn.toml 64 100" "samples/fashion_mnist_cnn.toml 512 50"; do
    set -- $spec
    mapfile -t ds < <(data_sets "$1")
    run "$B/bin/kiln_step_bench" "$1" "${ds[@]}" --set device.backend=vulkan --set train.batch_size=$2 --steps "$3"
  done
} > "$OUT/vulkan_gpu_$gpu.txt"
cat "$OUT/vulkan_gpu_$gpu.txt"

# Mixed precision (writes cuda_mp_<gpu>.txt itself).
if [ "$CARRIED" = 1 ]; then bench/cuda/run_mp_bench.sh --carried; else bench/cuda/run_mp_bench.sh "$B"; fi | tail -20

if [ -n "${KILN_OUT:-}" ]; then cp "$OUT"/cuda_*_"$gpu".* "$OUT"/vulkan_gpu_"$gpu".txt "$KILN_OUT"/ 2>/dev/null; fi
