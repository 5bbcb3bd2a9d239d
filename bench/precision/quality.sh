#!/usr/bin/env bash
# What bfloat16 costs in quality: the samples trained whole in float32 and in bfloat16, one after the other.
#   bench/precision/quality.sh [build-dir] [gpt|resnet|cnn|mlp]...   (default: all four)
# gpt: samples/shakespeare_char.toml (2000 iterations) for seeds 1337, 1, 2 (SEEDS to change), float32 then bfloat16
#      per seed, each ending with nanoGPT's validation estimate (20 random batches of 12 windows, the run's last
#      "test loss") and kiln evaluate on 2,400 random windows.
# resnet, cnn, mlp: the sample as shipped (its seed), float32 then bfloat16: the last epoch's test accuracy.
# Prints one line per run (precision, seed, figures, wall seconds).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}"
shift || true
WHAT=("$@")
[ ${#WHAT[@]} -gt 0 ] || WHAT=(gpt resnet cnn mlp)
SEEDS=${SEEDS:-"1337 1 2"}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
run() {  # name config precision [--set ...]: trains into $w/name, prints the log's last lines into $w/name.log
  local name=$1 cfg=$2 p=$3
  shift 3
  local t0 t1
  t0=$(date +%s.%N)
  "$B/bin/kiln" train "$cfg" --set "precision.compute=\"$p\"" --set train.output_dir="\"$w/$name\"" \
    --set 'train.progress="lines"' "$@" > "$w/$name.log" 2>&1
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
for what in "${WHAT[@]}"; do
  case $what in
    gpt)
      cfg=samples/shakespeare_char.toml
      for s in $SEEDS; do
        for p in float32 bfloat16; do
          secs=$(run "g$s$p" "$cfg" "$p" --set run.seed="$s")
          small=$(grep -o 'test loss [0-9][0-9.]*' "$w/g$s$p.log" | tail -1 | cut -d' ' -f3)
          big=$("$B/bin/kiln" evaluate "$cfg" --checkpoint "$w/g$s$p/checkpoint.kiln" \
                  --set train.output_dir="\"$w/g$s$p\"" --set 'data.test.stages[0].examples_per_epoch=2400' 2>&1 |
                grep -o 'loss [0-9][0-9.]*' | tail -1 | cut -d' ' -f2)
          printf 'gpt    %-9s seed %-5s val loss %s (20 batches) %s (2400 windows) %8.1f s\n' "$p" "$s" "$small" "$big" "$secs"
        done
      done
      ;;
    resnet | cnn | mlp)
      cfg=samples/$([ "$what" = resnet ] && echo resnet_fashion_mnist || echo "fashion_mnist_$what").toml
      mapfile -t ds < <(data_sets "$cfg")
      for p in float32 bfloat16; do
        secs=$(run "$what$p" "$cfg" "$p" "${ds[@]}")
        acc=$(grep -o 'test accuracy [0-9][0-9.]*' "$w/$what$p.log" | tail -1 | cut -d' ' -f3)
        printf '%-6s %-9s test accuracy %s %8.1f s\n' "$what" "$p" "$acc" "$secs"
      done
      ;;
    *) echo "unknown: $what (gpt, resnet, cnn, mlp)" >&2; exit 2 ;;
  esac
done
