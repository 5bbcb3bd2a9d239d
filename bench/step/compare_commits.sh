#!/usr/bin/env bash
# Kiln's training step in two builds, alternating, in one run: whether a change made a step slower.
#   bench/step/compare_commits.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [reps]
# e.g. git worktree add /tmp/before <commit> && (cd /tmp/before && ./setup.sh build), then
#   bench/step/compare_commits.sh /tmp/before/build build
# Environment (bench/common.sh): KILN_FASHION_MNIST. Run it under bench/lock.sh on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
before=$1 after=$2 reps=${3:-5}
ms() { sed -E 's/.*median ([0-9.]+) ms.*/\1/'; }
uptime
for rep in $(seq 1 "$reps"); do
  for cfg in "samples/fashion_mnist_mlp.toml 32 300" "samples/fashion_mnist_mlp.toml 128 200" "samples/fashion_mnist_cnn.toml 64 40"; do
    set -- $cfg
    mapfile -t ds < <(data_sets "$1")
    b=$("$before/bin/kiln_step_bench" "$1" "${ds[@]}" --set train.batch_size="$2" --steps "$3" 2>/dev/null | ms)
    a=$("$after/bin/kiln_step_bench" "$1" "${ds[@]}" --set train.batch_size="$2" --steps "$3" 2>/dev/null | ms)
    echo "rep $rep $(basename "$1") batch $2: before $b ms, after $a ms"
  done
done
uptime
