#!/usr/bin/env bash
# Time from `kiln train`'s start to its first training step, beside the step time, for every sample.
#   bench/startup/first_step.sh [build-dir] [runs]
# Each sample trains a few steps (train.steps_per_epoch) of one epoch in a scratch run directory; `kiln train`'s
# last line reports when the first step began. The step time is the epoch's s/batch (a few steps: first-step
# costs included, so an upper bound; bench/step has the steady-state figures). The fastest of `runs` is kept.
# Environment (bench/common.sh): KILN_FASHION_MNIST. Run it under bench/lock.sh on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="$(cd "${1:-build}" && pwd)"
RUNS="${2:-3}"
ROOT="$PWD"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf "%-28s %10s %14s %12s\n" sample steps "first step s" "s/batch"
for cfg in samples/*.toml; do
  name=$(basename "$cfg" .toml)
  steps=20
  best="" sb=""
  mapfile -t ds < <(data_sets "$cfg")
  for ((r = 0; r < RUNS; ++r)); do
    out=$(cd "$work" && "$B/bin/kiln" train "$ROOT/$cfg" "${ds[@]}" --overwrite --set train.epochs=1 \
      --set train.steps_per_epoch=$steps --set "train.output_dir=\"$work/run\"" 2>&1) || {
      echo "$name: kiln train failed:"; echo "$out" | tail -3; continue 2; }
    t=$(echo "$out" | sed -nE 's/.*first step began ([0-9.]+) s after start.*/\1/p')
    s=$(echo "$out" | sed -nE 's/.*epoch 1\/1: .*, ([0-9.]+) s\/batch.*/\1/p' | tail -1)
    if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then best=$t; sb=$s; fi
  done
  printf "%-28s %10d %14s %12s\n" "$name" "$steps" "$best" "$sb"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
