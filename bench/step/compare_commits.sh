#!/usr/bin/env bash
# Kiln's training step in two builds, alternating, in one run: whether a change made a step slower.
#   bench/step/compare_commits.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [reps]
# e.g. git worktree add /tmp/before <commit> && (cd /tmp/before && ./setup.sh build), then
#   bench/step/compare_commits.sh /tmp/before/build build
# Rows: the MLP at batch 32 and 128, the CNN at 64, the ResNet and the GPT (shakespeare_char) samples at their own
# batch; ROWS="mlp32 cnn64" picks some. Each prints the median ms of kiln_step_bench (--set device.threads=2).
# Environment (bench/common.sh): KILN_FASHION_MNIST. Run it under bench/lock.sh on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
before=$1 after=$2 reps=${3:-5}
ms() { sed -E 's/.*median ([0-9.]+) ms.*/\1/'; }
uptime
declare -A rows=(
  [mlp32]="samples/fashion_mnist_mlp.toml 32 300" [mlp128]="samples/fashion_mnist_mlp.toml 128 200"
  [cnn64]="samples/fashion_mnist_cnn.toml 64 40" [resnet]="samples/resnet_fashion_mnist.toml 0 20"
  [gpt]="samples/shakespeare_char.toml 0 20 --ids 65 --classes 65")
for rep in $(seq 1 "$reps"); do
  for row in ${ROWS:-mlp32 mlp128 cnn64 resnet gpt}; do
    set -- ${rows[$row]}
    mapfile -t ds < <(data_sets "$1")
    batch=()
    [ "$2" != 0 ] && batch=(--set train.batch_size="$2")
    cfg=$1 steps=$3
    shift 3
    step() { "$1/bin/kiln_step_bench" "$cfg" "${ds[@]}" "${batch[@]}" --set device.threads=2 --steps "$steps" "${@:2}" | ms; }
    b=$(step "$before" "$@")
    a=$(step "$after" "$@")
    echo "rep $rep $row: before $b ms, after $a ms"
  done
done
uptime
