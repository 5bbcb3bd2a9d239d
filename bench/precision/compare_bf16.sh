#!/usr/bin/env bash
# Kiln's training step in bfloat16 against its float32 step and against PyTorch 2 with
# torch.autocast("cpu", dtype=torch.bfloat16), in one run, alternating (this host has slow phases that move a step by
# up to 2x): each round times every row once, ROUNDS rounds (default 3), and each row's range and best are printed.
#   bench/precision/compare_bf16.sh [build-dir]
# Rows: the MLP sample at batch 512, the CNN sample at batch 256, the GPT sample (shakespeare_char) and the ResNet
# sample at their own batch sizes, 12 and 128 (kiln_step_bench: a fixed batch, copy-in + forward + backward + update).
# PyTorch 2 (.venv-peers, bench/peers/setup_peers.sh) times the same four models at the same batch sizes
# (bench/peers/torch2_step.py: real data drawn each step, Fashion-MNIST batches gathered, for the ResNet each image
# flipped with probability 1/2 as the sample's pipeline does, random windows of tiny Shakespeare for the GPT; each
# sample's optimizer, schedule and clipping; glibc's malloc thresholds raised, TORCH_THREADS 1 and 2 tried, fastest
# kept); without .venv-peers only Kiln's rows run. The bf16 peak of this CPU comes from kiln_bf16_bench.
# Environment: ROUNDS, ROWS="mlp cnn gpt resnet", KILN_BENCH_LOCK=0 (bench/common.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}"
K="$LOCK"
P="$PEERS_PYTHON"
ROUNDS=${ROUNDS:-3}
ROWS=${ROWS:-"mlp cnn gpt resnet"}
M=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864)
BF='precision.compute="bfloat16"'
ms() { sed -nE 's/.*median ([0-9.]+) ms.*/\1/p' | tail -1; }
kiln_row() {  # sample, then extra kiln_step_bench arguments
  local cfg="samples/$1.toml"
  shift
  "$K" "$B/bin/kiln_step_bench" "$cfg" --steps 60 --warmup 10 "$@" 2>/dev/null | ms
}
kiln_args() {
  case $1 in
    mlp) echo "fashion_mnist_mlp --set train.batch_size=512" ;;
    cnn) echo "fashion_mnist_cnn --set train.batch_size=256" ;;
    gpt) echo "shakespeare_char --ids 65 --classes 65" ;;
    resnet) echo "resnet_fashion_mnist" ;;
  esac
}
torch_batch() {
  case $1 in
    mlp) echo 512 ;;
    cnn) echo 256 ;;
    gpt) echo 12 ;;
    resnet) echo 128 ;;
  esac
}
torch_row() {  # kind batch [--amp=bf16]: the faster of 1 and 2 threads
  local best=""
  for t in 1 2; do
    local v
    v=$(env "${M[@]}" TORCH_THREADS=$t "$K" "$P" bench/peers/torch2_step.py "$@" 200 2>/dev/null | ms)
    [ -n "$v" ] && { [ -z "$best" ] || awk -v a="$v" -v b="$best" 'BEGIN{exit !(a<b)}'; } && best=$v
  done
  echo "$best"
}
echo "# $(date -u +%F) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); kiln $(git rev-parse --short HEAD)"
"$K" "$B/bin/kiln_bf16_bench" 0.3 2>/dev/null | grep -iE "peak|threads" | head -4
declare -A all
have_torch=0
[ -x "$P" ] && "$P" -c "import torch" 2>/dev/null && have_torch=1
for r in $(seq 1 "$ROUNDS"); do
  for row in $ROWS; do
    read -r -a a <<<"$(kiln_args "$row")"
    all["$row kiln-f32"]+=" $(kiln_row "${a[@]}")"
    all["$row kiln-bf16"]+=" $(kiln_row "${a[@]}" --set "$BF")"
    if [ "$have_torch" = 1 ]; then
      batch=$(torch_batch "$row")
      all["$row torch-f32"]+=" $(torch_row "$row" "$batch")"
      all["$row torch-bf16"]+=" $(torch_row "$row" "$batch" --amp=bf16)"
    fi
  done
  echo "round $r done" >&2
done
best() { tr ' ' '\n' | grep -v '^$' | sort -g | head -1; }
range() { tr ' ' '\n' | grep -v '^$' | sort -g | awk 'NR==1{lo=$1} {hi=$1} END{printf "%s-%s", lo, hi}'; }
printf "%-8s %-11s %-22s %-9s\n" row setting "ms/step (range)" best
for row in $ROWS; do
  for s in kiln-f32 kiln-bf16 torch-f32 torch-bf16; do
    v="${all["$row $s"]:-}"
    [ -z "${v// /}" ] && continue
    printf "%-8s %-11s %-22s %-9s\n" "$row" "$s" "$(echo "$v" | range)" "$(echo "$v" | best)"
  done
  kf=$(echo "${all["$row kiln-f32"]}" | best)
  kb=$(echo "${all["$row kiln-bf16"]}" | best)
  line="$row: kiln bf16 speed-up over kiln f32 (best of each): $(awk -v a="$kf" -v b="$kb" 'BEGIN{printf "%.2fx", a/b}')"
  tb=$(echo "${all["$row torch-bf16"]:-}" | best)
  [ -n "$tb" ] && line+="; kiln bf16 against torch autocast bf16: $(awk -v a="$tb" -v b="$kb" 'BEGIN{printf "%.2fx", a/b}')"
  echo "$line"
done
