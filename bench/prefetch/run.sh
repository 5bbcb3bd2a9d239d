#!/usr/bin/env bash
# Step time of a training run over a slow synthetic source (1 ms per example, 64 ms per batch of 64), without and with
# prefetch, against compute alone (latency 0) and load alone (latency x batch).
#   bench/prefetch/run.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
B="${1:-build}"
cfg=bench/prefetch/synthetic_latency.toml
pre=$(mktemp --suffix=.toml)
trap 'rm -f "$pre"' EXIT
sed 's/  { type = "batch" },/  { type = "batch" },\n  { type = "prefetch", depth = 4 },/' "$cfg" >"$pre"
spb() { "$B/bin/kiln" train "$@" | grep -oE '[0-9.]+ s/batch' | head -1; }
echo "compute only (latency 0):     $(spb "$cfg" --set 'data.train.stages[0].latency_ms=0')"
echo "load only (1 ms x 64):        0.0640 s/batch"
echo "compute + load, no prefetch:  $(spb "$cfg")"
echo "with prefetch (depth 4):      $(spb "$pre")"
