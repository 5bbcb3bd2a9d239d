#!/usr/bin/env bash
# Times `kiln plan` on chain models of N layers (dense 16 / relu alternating, Adam, batch 8): planning must stay
# fast for very deep models.
# usage: bench/planning/run.sh [build/bin/kiln] [N ...]     (default N: 2000 8000 50000 175000)
# Environment (bench/common.sh): PYTHON (writes the models). Run it under bench/lock.sh on a shared machine.
set -euo pipefail
source "$(dirname "$0")/../common.sh"
kiln=${1:-build/bin/kiln}
shift || true
sizes=${*:-2000 8000 50000 175000}
dir=$(mktemp -d)
for n in $sizes; do
  "$PYTHON" "$(dirname "$0")/deep_model.py" "$n" "$dir/deep_$n.toml"
  /usr/bin/time -f "$n layers: %e s, %M KB peak RSS" "$kiln" plan "$dir/deep_$n.toml" > "$dir/out_$n.txt"
  grep -E "verdict|largest batch" "$dir/out_$n.txt" | sed 's/^/    /'
done
rm -rf "$dir"
