#!/usr/bin/env bash
# One training epoch, end to end (data pipeline included, evaluation excluded), of both Fashion-MNIST samples:
# `kiln train` against each peer's epoch loop at its fastest setting found by bench/peers/run_peers.sh (2 threads;
# PyTorch with OPENBLAS_NUM_THREADS=1 and glibc's malloc thresholds raised; a randperm + gather loop, faster than
# DataLoader here). Kiln runs the sample with its EMA off, as no peer keeps one; its epoch time is the one the
# trainer prints (first batch to last step). Peers print theirs after 5 warm-up steps (JIT compilation excluded).
#   bench/step/compare_epochs.sh [build-dir]
# Every command takes the build lock itself (bench/lock.sh). Environment (bench/common.sh): KILN_FASHION_MNIST, PYTHON
# (Debian's PyTorch), PEERS_PYTHON, KILN_BENCH_LOCK=0.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}"
K="$LOCK"
P="$PEERS_PYTHON"
M=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for c in "mlp 32 samples/fashion_mnist_mlp.toml" "cnn 64 samples/fashion_mnist_cnn.toml"; do
  set -- $c
  kind=$1 batch=$2 cfg=$3
  mapfile -t ds < <(data_sets "$cfg")
  out=$("$K" "$B/bin/kiln" train "$cfg" "${ds[@]}" --overwrite --set train.epochs=1 --set train.evaluate=false \
    --set optimizer.ema=0 --set train.checkpoint_every=0 --set "train.output_dir=\"$work/run\"" 2>&1)
  echo "kiln $kind batch $batch: epoch $(echo "$out" | sed -nE 's/.*epoch 1\/1: train loss [0-9.]+, ([0-9.]+) s.*/\1/p') s"
  "$K" env "${M[@]}" OPENBLAS_NUM_THREADS=1 TORCH_THREADS=2 "$PYTHON" bench/peers/torch_epoch.py $kind $batch 2>&1 | grep -E '^torch'
  if [ -x "$P" ]; then
    "$K" env "${M[@]}" TORCH_THREADS=2 "$P" bench/peers/torch2_step.py $kind $batch --epoch 2>&1 | grep -E '^torch'
    pool=""
    [ $kind = cnn ] && pool=--reshape-pool
    "$K" "$P" bench/peers/jax_step.py $kind $batch --epoch $pool 2>&1 | grep -E '^jax'
    "$K" "$P" bench/peers/keras_step.py $kind $batch --epoch 2>&1 | grep -E '^keras'
  fi
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
