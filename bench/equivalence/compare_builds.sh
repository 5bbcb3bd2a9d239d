#!/usr/bin/env bash
# Trains every sample for a few steps with two builds of Kiln (same seed, same data) and compares what each run
# wrote to metrics.jsonl: train loss, test loss and accuracy of every epoch must be equal to the last digit. A
# refactoring that changes no arithmetic passes this; one that moves a sum's order does not.
#   bench/equivalence/compare_builds.sh OLD_BUILD NEW_BUILD [SAMPLE.toml ...]
#     OLD_BUILD, NEW_BUILD: build directories (each bin/kiln loads its own lib/kiln/*.so), e.g. a worktree of the
#     previous commit built with ./setup.sh build, and build/
#   EPOCHS (default 2) and STEPS (steps per epoch, default 20) bound each run; OUT (default a temporary directory)
#   keeps the runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
old=${1:?usage: compare_builds.sh OLD_BUILD NEW_BUILD [SAMPLE.toml ...]}
new=${2:?usage: compare_builds.sh OLD_BUILD NEW_BUILD [SAMPLE.toml ...]}
shift 2
samples=("$@")
[ ${#samples[@]} -gt 0 ] || samples=(samples/*.toml)
epochs=${EPOCHS:-2}
steps=${STEPS:-20}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
status=0
for s in "${samples[@]}"; do
  name=$(basename "$s" .toml)
  for side in old new; do
    build=$old
    [ "$side" = new ] && build=$new
    "$build/bin/kiln" train "$s" --overwrite --set train.epochs="$epochs" \
      --set train.steps_per_epoch="$steps" --set train.output_dir="$out/$side/$name" >"$out/$side-$name.log" 2>&1 ||
      { echo "$name: the $side build failed (log: $out/$side-$name.log)"; status=1; continue 2; }
  done
  if python3 - "$out/old/$name/metrics.jsonl" "$out/new/$name/metrics.jsonl" <<'PY'; then
import json, sys
keys = ("epoch", "step", "train_loss", "test_loss", "test_accuracy")
rows = [[{k: r.get(k) for k in keys} for r in map(json.loads, open(p)) if r.get("event") == "epoch"] for p in sys.argv[1:]]
if not rows[0] or rows[0] != rows[1]:
    print("  old:", rows[0]); print("  new:", rows[1]); sys.exit(1)
print("  " + "; ".join(f"epoch {r['epoch']}: train {r['train_loss']} test {r['test_loss']} acc {r['test_accuracy']}" for r in rows[0]))
PY
    echo "$name: same losses"
  else
    echo "$name: DIFFERENT"
    status=1
  fi
done
exit $status
