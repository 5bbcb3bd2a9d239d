#!/usr/bin/env bash
# A sample's per-step loss curve on another backend against the CPU backend's, same seed, data and initial weights.
#   bench/accuracy/backend_curve.sh [build-dir] [backend] [steps] [config] [tolerance]
# defaults: build vulkan 200 samples/shakespeare_char.toml 1e-3. Trains STEPS steps on each backend (evaluation off,
# one metrics record per step), prints every 10th step's losses and the worst relative difference, and exits 1 when
# any step differs by more than the tolerance.
# Environment (bench/common.sh): KILN_FASHION_MNIST (a Fashion-MNIST config), PYTHON (compares the curves).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}" BACKEND="${2:-vulkan}" N="${3:-200}" CFG="${4:-samples/shakespeare_char.toml}" TOL="${5:-1e-3}"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
mapfile -t ds < <(data_sets "$CFG")
for be in cpu "$BACKEND"; do
  start=$(date +%s%N)
  "$B/bin/kiln" train "$CFG" "${ds[@]}" --set "device.backend=\"$be\"" --set train.max_steps="$N" --set train.evaluate=false \
    --set log.every_steps=1 --set 'train.progress="none"' --set train.output_dir="\"$w/$be\"" > "$w/$be.log"
  echo "$be: $N steps in $(( ($(date +%s%N) - start) / 1000000 )) ms ($(grep -m1 '^device ' "$w/$be.log"))"
done
"$PYTHON" - "$w/cpu/metrics.jsonl" "$w/$BACKEND/metrics.jsonl" "$N" "$TOL" "$BACKEND" <<'PY'
import json, sys
def curve(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if r.get("event") == "step"}
a, b, n, tol, be = curve(sys.argv[1]), curve(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
worst = 0.0
for s in range(1, n + 1):
    if s not in a or s not in b:
        sys.exit(f"step {s}: no loss recorded on {'cpu' if s not in a else be}")
    rel = abs(a[s] - b[s]) / abs(a[s])
    worst = max(worst, rel)
    if s <= 3 or s % 10 == 0:
        print(f"step {s:4d}: cpu {a[s]:.6f}  {be} {b[s]:.6f}  relative {rel:.2e}")
print(f"worst relative loss difference over {n} steps, {be} against cpu: {worst:.3g} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
