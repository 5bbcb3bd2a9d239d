#!/bin/bash
# Peak memory of the same training steps in Kiln and PyTorch (CPU, RSS), plus Kiln's plan and allocator peak.
# Usage: bench/memory/run.sh BUILD_DIR   (prints a Markdown table for bench/results/memory.md; several minutes on 2 cores)
# Environment (bench/common.sh): KILN_FASHION_MNIST, PYTHON (with PyTorch). Run it under bench/lock.sh on a shared
# machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
BUILD=${1:-build}
KILN="$BUILD/bin/kiln"
OUT=$(mktemp -d)
export KILN_RESERVATION_DIR=off
common=(--set train.epochs=1 --set train.evaluate=false --set train.checkpoint_every=0 --set 'train.progress="none"')

kiln_rss() {  # config steps -> "peak_rss_mib seconds"
  rm -rf "$OUT/run"  # a run directory is never reused silently: a second run into it would be refused
  local -a ds
  mapfile -t ds < <(data_sets "$1")
  if ! /usr/bin/time -f "%M %e" -o "$OUT/time" "$KILN" train "$1" "${ds[@]}" "${common[@]}" --set train.steps_per_epoch="$2" \
    --set "train.output_dir=\"$OUT/run\"" "${@:3}" > "$OUT/log" 2>&1; then
    echo "kiln train $1 failed:" >&2; cat "$OUT/log" >&2; echo "failed -"; return
  fi
  awk '{printf "%.1f %s", $1 / 1024, $2}' "$OUT/time"
}
kiln_plan() {  # config batch -> "predicted_mib measured_mib" (one real step, allocator peak in use)
  local -a ds
  mapfile -t ds < <(data_sets "$1")
  "$KILN" plan "$1" "${ds[@]}" --sweep --sweep-out "$OUT/sweep" --set "memory.sweep_batches=[$2]" "${@:3}" > /dev/null
  awk -F, 'NR == 2 {printf "%.1f %.1f", $2 / 1048576, $3 / 1048576}' "$OUT/sweep/memory_sweep.csv"
}

# PyTorch runs twice: with glibc's default malloc thresholds (how a user runs it) and with
# MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864 (the setting bench/ tries for PyTorch's speed; it
# keeps freed memory up to 64 MiB in the heap rather than returning it). "during the steps" is the peak from the first step on
# (torch_peak.py's train_peak_mib), without the transient of reading the data set.
echo "| model | steps | Kiln plan (MiB) | Kiln allocator peak (MiB) | Kiln peak RSS (MiB) | PyTorch peak RSS (MiB) | PyTorch peak RSS, raised malloc thresholds (MiB) | PyTorch peak during the steps, default / raised (MiB) | PyTorch RSS after import (MiB) |"
echo "|---|---|---|---|---|---|---|---|---|"
row() {  # name config torch_name steps batch [kiln extra args...]
  local name=$1 cfg=$2 tname=$3 steps=$4 batch=$5
  shift 5
  read -r pred meas <<< "$(kiln_plan "$cfg" "$batch" "$@")"
  read -r krss ksec <<< "$(kiln_rss "$cfg" "$steps" "$@")"
  local t r
  t=$("$PYTHON" bench/memory/torch_peak.py "$tname" "$steps")
  r=$(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864 "$PYTHON" bench/memory/torch_peak.py "$tname" "$steps")
  field() { sed -E "s/.*$1=([0-9.]+).*/\\1/" <<< "$2"; }
  echo "| $name | $steps | $pred | $meas | $krss | $(field peak_rss_mib "$t") | $(field peak_rss_mib "$r") |" \
    "$(field train_peak_mib "$t") / $(field train_peak_mib "$r") | $(field rss_after_import_mib "$t") |"
}
row "fashion_mnist_mlp (Adam, batch 32)" samples/fashion_mnist_mlp.toml mlp 200 32
row "fashion_mnist_cnn (Adam, batch 64)" samples/fashion_mnist_cnn.toml cnn 50 64
row "fashion_mnist_cnn, [memory] inplace = true" samples/fashion_mnist_cnn.toml cnn 50 64 --set memory.inplace=true
row "seed_deep_conv (206,538,153 params, SGD, batch 1)" samples/seed_deep_conv.toml deep 5 1
rm -rf "$OUT"
