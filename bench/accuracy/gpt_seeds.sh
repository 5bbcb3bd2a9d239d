#!/usr/bin/env bash
# nanoGPT's shakespeare_char recipe (samples/shakespeare_char.toml) over several seeds, Kiln and PyTorch alternating
# seed by seed on the same host, each whole 2000-iteration run ending with nanoGPT's validation estimate (20 random
# batches of 12 windows) and a ten times larger one (2,400 random windows, 200 batches).
#   bench/accuracy/gpt_seeds.sh [build-dir] SEED...
# PyTorch: bench/accuracy/torch_shakespeare_char.py (nanoGPT's model.py and train.py loop) at 1 torch thread x
# OpenBLAS 2 (its best setting here, bench/results/shakespeare_char.md), malloc thresholds raised. Prints one line per
# seed and framework, then the means. Environment (bench/common.sh): PYTHON (with PyTorch).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}"
shift || true
[ $# -gt 0 ] || { echo "usage: $0 [build-dir] SEED..." >&2; exit 2; }
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
cfg=samples/shakespeare_char.toml
printf '%-6s %-8s %10s %12s %9s\n' seed who "20 batches" "2400 windows" "wall s"
for s in "$@"; do
  t0=$(date +%s.%N)
  OPENBLAS_NUM_THREADS=1 "$B/bin/kiln" train "$cfg" --set run.seed="$s" --set train.output_dir="\"$w/k$s\"" \
    --set 'train.progress="lines"' > "$w/k$s.log" 2>&1
  t1=$(date +%s.%N)
  small=$(grep -o 'test loss [0-9][0-9.]*' "$w/k$s.log" | tail -1 | cut -d' ' -f3)
  big=$(OPENBLAS_NUM_THREADS=1 "$B/bin/kiln" evaluate "$cfg" --checkpoint "$w/k$s/checkpoint.kiln" \
          --set train.output_dir="\"$w/k$s\"" --set 'data.test.stages[0].examples_per_epoch=2400' 2>&1 |
        grep -o 'loss [0-9][0-9.]*' | tail -1 | cut -d' ' -f2)
  printf '%-6s %-8s %10s %12s %9.1f\n' "$s" kiln "$small" "$big" "$(echo "$t1 - $t0" | bc)"
  t0=$(date +%s.%N)
  MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864 OPENBLAS_NUM_THREADS=2 \
    "$PYTHON" bench/accuracy/torch_shakespeare_char.py --threads 1 --seed "$s" --final-eval-iters 200 \
    > "$w/p$s.log" 2>&1
  t1=$(date +%s.%N)
  small=$(grep -o 'final val loss [0-9][0-9.]*' "$w/p$s.log" | cut -d' ' -f4)
  big=$(grep -o 'val loss over [0-9]* batches: [0-9.]*' "$w/p$s.log" | grep -o '[0-9.]*$' || true)
  printf '%-6s %-8s %10s %12s %9.1f\n' "$s" pytorch "$small" "$big" "$(echo "$t1 - $t0" | bc)"
done | tee "$w/table"
awk 'NR > 0 && ($2 == "kiln" || $2 == "pytorch") { n[$2]++; a[$2] += $3; b[$2] += $4; if ($3 <= 1.89) m[$2]++ }
     END { for (k in n) printf "mean %-8s %10.4f %12.4f   (%d of %d at or under 1.89 on 20 batches)\n", k, a[k] / n[k], b[k] / n[k], m[k], n[k] }' "$w/table"
