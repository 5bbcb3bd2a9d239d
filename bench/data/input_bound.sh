#!/usr/bin/env bash
# The progress line's "input-bound" figure (the share of an epoch's wall time the trainer waits for its next batch)
# of every sample, epochs 1 and 2, at the samples' own settings. The long samples run shortened so that two epochs
# take seconds, each with the override named below; the pipeline itself is the sample's.
#   bench/data/input_bound.sh [build-dir] [out-dir]     (about 3 minutes on the 2-core host)
# Prints one line per sample and epoch: sample, epoch, input-bound % (from metrics.jsonl's input_wait_fraction, one
# decimal), seconds, examples/s, train loss; keeps each run's log in out-dir (default a temporary directory) so the
# loss lines of two builds can be compared (`diff <(grep -h '^epoch [0-9]*/[0-9]*:' A/*.log | sed 's/, [0-9.]* s,.*//')
# <(... B ...)`). Each run holds bench/lock.sh's lock. Environment: KILN_FASHION_MNIST (bench/common.sh), SAMPLES
# (space-separated sample names without .toml, default all), SAMPLE_DIR (where they are, default samples; a copy
# with edited [data] sections, say), RUNS (rounds over the samples, default 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}"
OUT="${2:-$(mktemp -d)}"
mkdir -p "$OUT"
RUNS="${RUNS:-1}"

# The overrides that make the long samples' two epochs short. Everything else is the sample's own setting.
overrides() {
  case "$1" in
    resnet_fashion_mnist) echo "train.epochs=2 data.train.stages[0].limit=12800 data.test.stages[0].limit=2560" ;;
    shakespeare_char) echo "train.epochs=2 train.steps_per_epoch=60" ;;
    shakespeare_char_mlp) echo "train.epochs=2 train.steps_per_epoch=250" ;;
    seed_deep_conv) echo "train.epochs=2" ;;
    fashion_mnist_ln_gelu) echo "train.epochs=2" ;;
    *) echo "" ;;
  esac
}

SAMPLE_DIR="${SAMPLE_DIR:-samples}"
names="${SAMPLES:-$(for f in "$SAMPLE_DIR"/*.toml; do basename "$f" .toml; done)}"
echo "# $(date -u '+%F %T') UTC, load average $(cut -d' ' -f1-3 /proc/loadavg), build $B, out $OUT"
printf "%-22s %5s %12s %8s %12s %10s   %s\n" sample epoch input-bound% seconds examples/s "train loss" overrides
for ((r = 0; r < RUNS; r++)); do
  for n in $names; do
    cfg="$SAMPLE_DIR/$n.toml"
    if [ "$n" = gpt2_small ] && [ ! -f "$SAMPLE_DIR/models/gpt2/model.safetensors" ]; then
      echo "$n: not run: it needs GPT-2's weights and tokens, which do not ship (see the sample's header)"
      continue
    fi
    sets=()
    for o in $(overrides "$n"); do sets+=(--set "$o"); done
    mapfile -t ds < <(data_sets "$cfg")
    log="$OUT/$n.$r.log"
    if ! "$LOCK" "$B/bin/kiln" train "$cfg" "${sets[@]}" "${ds[@]}" --set "train.output_dir=\"$OUT/$n.$r\"" \
      --set train.progress=\"none\" --overwrite > "$log" 2>&1; then
      echo "$n: kiln train failed, see $log" >&2
      tail -n 5 "$log" >&2
      continue
    fi
    python3 - "$OUT/$n.$r/metrics.jsonl" "$n" "$(overrides "$n")" <<'PY'
import json, sys
path, name, sets = sys.argv[1:]
for line in open(path):
    r = json.loads(line)
    if r.get("event") != "epoch":
        continue
    print(f"{name:<22} {r['epoch']:5d} {100 * r['input_wait_fraction']:12.1f} {r['seconds']:8.2f} "
          f"{r['examples_per_s']:12.0f} {r['train_loss']:10.4f}   {sets}")
PY
  done
done
