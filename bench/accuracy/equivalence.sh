#!/usr/bin/env bash
# Kiln against PyTorch step for step, from the same initial weights (Kiln's, read from its checkpoint).
#   bench/accuracy/equivalence.sh [build-dir] [steps] [mlp|gpt|resnet|all]
# mlp: the Fashion-MNIST MLP, the same batches in the same order, Adam with the same epsilon; prints the weight
#      differences after N steps (default 5).
# gpt: samples/shakespeare_char.toml (nanoGPT's GPT) with the text source's sequential windows, AdamW, warmup and
#      clipping; prints each step's loss beside PyTorch's and fails when any differs by more than 1e-4 relative
#      (default 100 steps).
# resnet: samples/resnet_fashion_mnist.toml (batch norm in training mode, residual adds, global average pooling) on
#      the first training images in order (no shuffle, no flip), Adam and the cosine decay over the steps, against
#      PyTorch in float32 and in float64 (default 100 steps; RESNET_LR sets the learning rate, default the sample's
#      2e-3; RESNET_SET adds one --set to Kiln's run); see resnet_equivalence.py for the pass rule.
# Environment (bench/common.sh): KILN_FASHION_MNIST, PYTHON (with PyTorch).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}" N="${2:-}" WHAT="${3:-all}"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
export OPENBLAS_NUM_THREADS=1
if [ "$WHAT" = mlp ] || [ "$WHAT" = all ]; then
  n=${N:-5}
  cfg=bench/accuracy/mlp_equivalence.toml
  mapfile -t ds < <(data_sets "$cfg")
  # Initial weights: one SGD step with a learning rate of 1e-30 leaves them unchanged and writes a checkpoint.
  "$B/bin/kiln" train "$cfg" "${ds[@]}" --set optimizer.type='"sgd"' --set optimizer.learning_rate=1e-30 \
    --set train.steps_per_epoch=1 --set train.output_dir="\"$w/init\"" >/dev/null
  "$B/bin/kiln" train "$cfg" "${ds[@]}" --set train.steps_per_epoch="$n" --set train.output_dir="\"$w/trained\"" >/dev/null
  "$PYTHON" bench/accuracy/equivalence.py "$w/init/checkpoint.kiln" "$w/trained/checkpoint.kiln" "$n"
fi
if [ "$WHAT" = gpt ] || [ "$WHAT" = all ]; then
  n=${N:-100}
  cfg=samples/shakespeare_char.toml
  # One sequential pass over the train split is 1307 batches of 12 windows; longer comparisons (the whole 2000-step
  # schedule) run epochs of 1000 steps, each starting again at window 0 (as the text source's sequential epochs do).
  spe=$n epochs=1
  if [ "$n" -gt 1300 ]; then
    spe=1000 epochs=$(( (n + 999) / 1000 ))
    [ $((n % 1000)) = 0 ] || { echo "equivalence.sh: gpt steps above 1300 must be a multiple of 1000, got $n" >&2; exit 2; }
  fi
  seq=(--set 'data.train.stages[0].sampling="sequential"' --set train.evaluate=false --set train.epochs=$epochs
       --set 'train.progress="none"')
  # Initial weights: one AdamW step at a learning rate of 1e-30 changes no weight (every update rounds away).
  "$B/bin/kiln" train "$cfg" "${seq[@]}" --set optimizer.learning_rate=1e-30 \
    --set optimizer.schedule.min_learning_rate=0 --set train.epochs=1 --set train.steps_per_epoch=1 \
    --set train.output_dir="\"$w/ginit\"" >/dev/null
  "$B/bin/kiln" train "$cfg" "${seq[@]}" --set train.steps_per_epoch="$spe" --set log.every_steps=1 \
    --set train.output_dir="\"$w/gtrained\"" >/dev/null
  "$PYTHON" bench/accuracy/gpt_equivalence.py "$w/ginit/checkpoint.kiln" "$w/gtrained/metrics.jsonl" "$n" "$spe"
fi
if [ "$WHAT" = resnet ] || [ "$WHAT" = all ]; then
  n=${N:-100}
  cfg=samples/resnet_fashion_mnist.toml
  fm=$KILN_FASHION_MNIST
  mapfile -t ds < <(data_sets "$cfg")
  plain=("${ds[@]}" --set "data.train.stages=[{type=\"idx\", images=\"$fm/train-images-idx3-ubyte.gz\", labels=\"$fm/train-labels-idx1-ubyte.gz\"}, {type=\"map\", ops=[{op=\"scale\", factor=0.00392156862745098}, {op=\"normalize\", mean=[0.2860], std=[0.3530]}]}, {type=\"batch\"}]"
         --set train.evaluate=false --set train.epochs=1 --set 'train.progress="none"')
  "$B/bin/kiln" train "$cfg" "${plain[@]}" --set optimizer.learning_rate=1e-30 --set train.steps_per_epoch=1 \
    --set train.output_dir="\"$w/rinit\"" >/dev/null
  lr=${RESNET_LR:-2e-3}
  # RESNET_SET: one more --set for Kiln's run, e.g. RESNET_SET=device.winograd=false
  "$B/bin/kiln" train "$cfg" "${plain[@]}" --set train.steps_per_epoch="$n" --set log.every_steps=1 \
    --set optimizer.learning_rate="$lr" --set train.output_dir="\"$w/rtrained\"" ${RESNET_SET:+--set "$RESNET_SET"} \
    >/dev/null
  "$PYTHON" bench/accuracy/resnet_equivalence.py "$w/rinit/checkpoint.kiln" "$w/rtrained/metrics.jsonl" \
    "$w/rtrained/checkpoint.kiln" "$n" "$lr"
fi
