#!/usr/bin/env bash
# Kiln's data pipeline against PyTorch's DataLoader on Fashion-MNIST (Debian dataset-fashion-mnist), samples/s.
#   bench/data/run.sh [build-dir] [epochs] [rounds]   (3 rounds: about an hour on a loaded 2-core host)
# Needs BUILD/bin/kiln_data_bench (cmake --build BUILD --target kiln_data_bench) and $PYTHON (default
# /usr/bin/python3) with torch.
#
# Each round runs every Kiln case, then every PyTorch case under each setting a user could pick: torch threads 1 and
# 2, OPENBLAS_NUM_THREADS 1 and 2, and glibc's default malloc thresholds or raised ones
# (MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864, which keep glibc from serving repeated ~1 MB
# temporaries with mmap/munmap; see bench/results/data_pipeline.md, 2026-11-24). Rounds interleave Kiln and
# PyTorch, and the order of PyTorch's settings rotates from round to round. The raw lines go to stdout as they come;
# at the end, a summary: each Kiln case's best and median round, each PyTorch case at its fastest setting (highest
# median; best and median round), and the ratios.
# PyTorch's cases: per-example Dataset.__getitem__ (torchvision's idiom) with workers 0, 1, 2, with and without
# augmentation, and --batched (a BatchSampler hands __getitem__ a whole batch's indices; the transforms run on the
# batch) with workers 0.
# Environment: RUN, if set, prefixes every timed command (e.g. RUN=bench/lock.sh to hold the build lock);
# KILN_FASHION_MNIST and PYTHON (bench/common.sh); KILN_CASES (space-separated kiln_data_bench case names, default all) and TORCH_CASES (';'-separated
# torch_loader.py argument lists, default the seven above) run a subset.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}"
E="${2:-3}"
R="${3:-3}"
RUN="${RUN:-}"
KILN_CASES="${KILN_CASES:-}"
TORCH_CASES="${TORCH_CASES:---workers 0;--workers 1;--workers 2;--workers 0 --aug;--workers 2 --aug;--workers 0 --batched;--workers 0 --batched --aug}"
IFS=';' read -r -a torch_cases <<< "$TORCH_CASES"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

settings=()
for m in default raised; do for t in 1 2; do for o in 1 2; do settings+=("$m $t $o"); done; done; done

torch_case() {  # malloc threads openblas [torch_loader args...]
  local m=$1 t=$2 o=$3
  shift 3
  local env=(OPENBLAS_NUM_THREADS="$o")
  [ "$m" = raised ] && env+=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864)
  $RUN env "${env[@]}" "$PYTHON" bench/data/torch_loader.py --data "$KILN_FASHION_MNIST" --threads "$t" --epochs "$E" "$@"
}

for ((r = 0; r < R; r++)); do
  echo "# round $((r + 1)) of $R, $(date -u '+%F %T') UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"
  if [ -z "$KILN_CASES" ]; then
    $RUN "$B/bin/kiln_data_bench" --data "$KILN_FASHION_MNIST" --epochs "$E" | tee -a "$LOG"
  else
    for k in $KILN_CASES; do
      $RUN "$B/bin/kiln_data_bench" --data "$KILN_FASHION_MNIST" --epochs "$E" --only "$k" | tail -n 1 | tee -a "$LOG"
    done
  fi
  n=${#settings[@]}
  for ((i = 0; i < n; i++)); do
    read -r m t o <<< "${settings[$(((i + r) % n))]}"
    for c in "${torch_cases[@]}"; do
      # shellcheck disable=SC2086  # each case is a word list
      torch_case "$m" "$t" "$o" $c | tee -a "$LOG"
    done
  done
done

"$PYTHON" - "$LOG" <<'EOF'
import statistics
import sys
from collections import defaultdict

kiln, torch = defaultdict(list), defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 3 or line.startswith("#") or not f[1].isdigit():
        continue
    if f[0].startswith("torch"):
        s = " ".join(f[3:]).replace("malloc=-/-", "malloc=default").replace("malloc=33554432/67108864", "malloc=raised")
        torch[(f[0], s)].append(float(f[1]))
    else:
        kiln[f[0]].append(float(f[1]))

print("\nKiln: case, best round, median round (samples/s)")
for c, v in kiln.items():
    print(f"  {c:<14} {max(v):10.0f} {statistics.median(v):10.0f}")
print("PyTorch, every setting: case, best round, median round, setting")
best = {}
for (c, s), v in sorted(torch.items()):
    print(f"  {c:<14} {max(v):10.0f} {statistics.median(v):10.0f}   {s}")
    if c not in best or statistics.median(v) > statistics.median(best[c][1]):
        best[c] = (s, v)
print("PyTorch at its fastest setting (highest median): case, best round, median round, setting")
for c, (s, v) in sorted(best.items()):
    print(f"  {c:<14} {max(v):10.0f} {statistics.median(v):10.0f}   {s}")
tb = lambda c: max(best[c][1])
tm = lambda c: statistics.median(best[c][1])
fastest = lambda cs: max((c for c in cs if c in best), key=tm, default=None)
t0 = fastest(("torch_w0", "torch_w1", "torch_w2"))
ta = fastest(("torch_aug_w0", "torch_aug_w2"))
print("Ratios, Kiln / PyTorch (per-example at its fastest worker count; batched): best, median")
for k, t in (("file", t0), ("cache_raw", t0), ("aug_w1", ta), ("cache_raw", "torch_batched_w0"),
             ("aug_w1", "torch_batched_aug_w0")):
    if k in kiln and t in best:
        print(f"  {k} / {t}: {max(kiln[k]) / tb(t):.1f}x {statistics.median(kiln[k]) / tm(t):.1f}x")
EOF
