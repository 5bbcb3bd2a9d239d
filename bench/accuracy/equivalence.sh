#!/usr/bin/env bash
# Kiln against PyTorch step for step: the same initial weights (Kiln's, read from its checkpoint), the same batches in
# the same order, Adam with the same epsilon; prints the weight differences after N steps.
#   bench/accuracy/equivalence.sh [build-dir] [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
B="${1:-build}" N="${2:-5}"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
cfg=bench/accuracy/mlp_equivalence.toml
# Initial weights: one SGD step with a learning rate of 1e-30 leaves them unchanged and writes a checkpoint.
"$B/bin/kiln" train "$cfg" --set optimizer.type='"sgd"' --set optimizer.learning_rate=1e-30 \
  --set train.steps_per_epoch=1 --set train.output_dir="\"$w/init\"" >/dev/null
"$B/bin/kiln" train "$cfg" --set train.steps_per_epoch="$N" --set train.output_dir="\"$w/trained\"" >/dev/null
OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/accuracy/equivalence.py "$w/init/checkpoint.kiln" "$w/trained/checkpoint.kiln" "$N"
