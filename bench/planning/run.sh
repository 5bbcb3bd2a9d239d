#!/usr/bin/env bash
# Times `kiln plan` on chain models of N layers (dense 16 / relu alternating, Adam, batch 8): issue 15 item 6.
# usage: bench/planning/run.sh [build/bin/kiln] [N ...]     (default N: 2000 8000 50000 175000)
set -euo pipefail
kiln=${1:-build/bin/kiln}
shift || true
sizes=${*:-2000 8000 50000 175000}
dir=$(mktemp -d)
for n in $sizes; do
  python3 "$(dirname "$0")/deep_model.py" "$n" "$dir/deep_$n.toml"
  /usr/bin/time -f "$n layers: %e s, %M KB peak RSS" "$kiln" plan "$dir/deep_$n.toml" > "$dir/out_$n.txt"
  grep -E "verdict|largest batch" "$dir/out_$n.txt" | sed 's/^/    /'
done
rm -rf "$dir"
