#!/usr/bin/env bash
# Step time of a training run over a slow synthetic source (0.15 ms per example), without and with prefetch, against
# compute alone (latency 0) and loading alone (the same source feeding a model that does almost nothing). All four
# are measured. Prefetch should bring the step from about compute + load down to about max(compute, load).
#   bench/prefetch/run.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
B="${1:-build}"
cfg=bench/prefetch/synthetic_latency.toml
pre=$(mktemp --suffix=.toml)
trap 'rm -f "$pre"' EXIT
sed 's/  { type = "batch" },/  { type = "batch" },\n  { type = "prefetch", depth = 4 },/' "$cfg" >"$pre"
spb() { "$B/bin/kiln" train --overwrite "$@" | grep -oE '[0-9.]+ s/batch' | head -1; }
echo "compute only (latency 0):            $(spb "$cfg" --set 'data.train.stages[0].latency_ms=0')"
echo "load only (flatten + dense 10):      $(spb bench/prefetch/load_only.toml)"
echo "compute + load, no prefetch:         $(spb "$cfg")"
echo "with prefetch (depth 4):             $(spb "$pre")"
echo "with prefetch, device_prefetch off:  $(spb "$pre" --set train.device_prefetch=false)"
