#!/usr/bin/env bash
# Kiln's CPU training step against PyTorch's (Debian python3-torch) for both samples, in one go, printing ratios.
# PyTorch runs a training loop over the real Fashion-MNIST tensors (torch_step.py) and gets its best setting among
# torch threads {1,2} x OPENBLAS_NUM_THREADS {1,2} x glibc's malloc thresholds {default, raised}; Kiln the same 2 cores.
#   bench/step/compare_pytorch.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
B="${1:-build}"
ms() { sed -E 's/.*median ([0-9.]+) ms.*/\1/'; }
run_case() {  # name config batch torch-kind steps
  local name=$1 cfg=$2 batch=$3 kind=$4 steps=$5
  local k best=""
  k=$("$B/bin/kiln_step_bench" "$cfg" --set train.batch_size=$batch --steps "$steps" | tee /dev/stderr | ms)
  for tt in 1 2; do
    for ob in 1 2; do
      for mm in default raised; do
        local t env=()
        [ "$mm" = raised ] && env=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864)
        t=$(env "${env[@]}" OPENBLAS_NUM_THREADS=$ob TORCH_THREADS=$tt /usr/bin/python3 bench/step/torch_step.py \
          "$kind" "$batch" "$steps" | tee /dev/stderr | ms)
        if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then best=$t; fi
      done
    done
  done
  printf "%-10s batch %4d: kiln %8.3f ms  pytorch(best) %8.3f ms  speed-up %.2fx\n" "$name" "$batch" "$k" "$best" \
    "$(awk "BEGIN{print $best/$k}")"
}
{
  run_case mlp samples/fashion_mnist_mlp.toml 32 mlp 300
  run_case mlp samples/fashion_mnist_mlp.toml 128 mlp 200
  run_case mlp samples/fashion_mnist_mlp.toml 512 mlp 100
  run_case cnn samples/fashion_mnist_cnn.toml 64 cnn 40
  run_case cnn samples/fashion_mnist_cnn.toml 256 cnn 20
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>/dev/null
