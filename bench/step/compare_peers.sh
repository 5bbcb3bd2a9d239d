#!/usr/bin/env bash
# Kiln's CPU training step against every peer a user would pick instead, in one run, each at its best setting:
# Debian's PyTorch 1.13 (bench/step/torch_step.py), and from .venv-peers (bench/peers/setup_peers.sh) PyTorch 2 eager
# and torch.compile, JAX (one jitted step) and Keras 3 on TensorFlow (model.fit). Every peer trains over the real
# Fashion-MNIST training set held in memory, a batch gathered each step; PyTorch is tried with glibc's malloc
# thresholds default and raised. Each row states the step's FLOP count (GEMM and convolution work: forward, weight
# gradients, input gradients except the first layer's), the GFLOP/s achieved and the fraction of this CPU's FP32 peak,
# measured in the same run by kiln_fma_peak on every core. Kiln is tried at [device] threads 1 and 2 like the peers'
# thread settings, fastest kept.
#   bench/step/compare_peers.sh [build-dir]
# QUICK=1 tries fewer settings: PyTorch with the raised malloc thresholds only (never slower here), torch.compile
# at 2 threads only, JAX's CNN with lax.reduce_window pooling only.
# ROWS="cnn64 cnn256" (kind and batch) runs only those rows.
# Without .venv-peers only Debian's PyTorch is measured. Every command takes the build lock itself (bench/lock.sh).
# Environment (bench/common.sh): KILN_FASHION_MNIST, PYTHON (the "torch1.13" peer), PEERS_PYTHON, KILN_BENCH_LOCK=0.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}"
K="$LOCK"
P="$PEERS_PYTHON"
M=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864)
QUICK=${QUICK:-0}
ms() { sed -nE 's/.*median ([0-9.]+) ms.*/\1/p' | tail -1; }
min() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "") print b; else if (b == "") print a; else print (b < a ? b : a) }'; }
# FLOP of one training step. MLP 784-256-256-10: 2*B*sum(in*out) forward, the same for the weight gradients and for
# the input gradients of all but the first layer. CNN: conv 1->32 at 28x28 (K=9), conv 32->64 at 14x14 (K=288),
# dense 3136->128, 128->10; the first convolution has no input gradient.
flop() {
  case $1 in
    mlp) echo $((2 * $2 * (3 * (784 * 256 + 256 * 256 + 256 * 10) - 784 * 256))) ;;
    cnn) echo $((2 * $2 * (2 * 784 * 32 * 9 + 3 * (196 * 64 * 288 + 3136 * 128 + 128 * 10)))) ;;
  esac
}
peak=$("$K" "$B/bin/kiln_fma_peak" | sed -nE 's/.*threads ([0-9.]+) GFLOP.*/\1/p')
echo "FP32 peak (kiln_fma_peak, every core): $peak GFLOP/s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A best
try() {  # peer, then the command
  local peer=$1 t
  shift
  t=$("$K" env "$@" 2>/dev/null | ms)
  [ -n "$t" ] && best[$peer]=$(min "${best[$peer]:-}" "$t")
  echo "  $peer: ${t:-failed}  ($*)" >&2
}
row() {  # kind batch steps
  local kind=$1 batch=$2 steps=$3 cfg
  best=()
  # The MLP sample keeps an EMA of its weights (optimizer.ema = 0.999); the peers train plain Adam, so Kiln does
  # too here: the same work on both sides.
  local same=()
  [ "$kind" = mlp ] && cfg=samples/fashion_mnist_mlp.toml same=(--set optimizer.ema=0) || cfg=samples/fashion_mnist_cnn.toml
  local -a ds
  mapfile -t ds < <(data_sets "$cfg")
  local tts=(1 2) mms=(default raised)
  [ "$QUICK" = 1 ] && mms=(raised)
  for tt in "${tts[@]}"; do
    # Kiln at its thread settings too, as every peer, fastest kept: one try per setting, spread over the row, so a
    # slow phase of a shared host does not decide Kiln's figure alone (peers get 2-4 tries each).
    try kiln "$B/bin/kiln_step_bench" "$cfg" "${ds[@]}" "${same[@]}" --set train.batch_size=$batch --set device.threads=$tt --steps "$steps"
    for mm in "${mms[@]}"; do
      local env=()
      [ "$mm" = raised ] && env=("${M[@]}")
      for ob in 1 2; do
        try torch1.13 "${env[@]}" OPENBLAS_NUM_THREADS=$ob TORCH_THREADS=$tt "$PYTHON" bench/step/torch_step.py $kind $batch $steps
      done
      if [ -x "$P" ]; then
        try torch2 "${env[@]}" TORCH_THREADS=$tt "$P" bench/peers/torch2_step.py $kind $batch $steps
        [ "$mm" = raised ] && { [ "$QUICK" != 1 ] || [ "$tt" = 2 ]; } && try torch2-compile "${env[@]}" TORCH_THREADS=$tt "$P" bench/peers/torch2_step.py $kind $batch $steps --compile
      fi
    done
    if [ -x "$P" ]; then
      try jax JAX_THREADS=$tt "$P" bench/peers/jax_step.py $kind $batch $steps
      [ "$kind" = cnn ] && [ "$QUICK" != 1 ] && try jax JAX_THREADS=$tt "$P" bench/peers/jax_step.py $kind $batch $steps --reshape-pool
      try keras TF_INTRA_THREADS=$tt TF_INTER_THREADS=2 "$P" bench/peers/keras_step.py $kind $batch $steps
    fi
  done
  local f fastest="" fp=""
  f=$(flop $kind $batch)
  for p in "${!best[@]}"; do
    [ "$p" = kiln ] && continue
    if [ -z "$fp" ] || awk "BEGIN{exit !(${best[$p]} < $fp)}"; then fp=${best[$p]}; fastest=$p; fi
  done
  awk -v kind=$kind -v b=$batch -v f=$f -v peak=$peak -v k=${best[kiln]} -v fp="$fp" -v fastest="$fastest" \
      -v all="$(for p in torch1.13 torch2 torch2-compile jax keras; do printf "%s %s  " $p "${best[$p]:--}"; done)" 'BEGIN{
    gk = f / (k * 1e-3) / 1e9
    printf "%s batch %d: %.4f GFLOP/step | kiln %.3f ms, %.1f GFLOP/s, %.0f%% of peak", kind, b, f / 1e9, k, gk, 100 * gk / peak
    if (fp != "") {
      gp = f / (fp * 1e-3) / 1e9
      printf " | fastest peer %s %.3f ms, %.1f GFLOP/s, %.0f%% of peak | kiln speed-up %.2fx", fastest, fp, gp, 100 * gp / peak, fp / k
    }
    printf "\n    every peer (ms, best setting): %s\n", all
  }'
}
# ROWS="cnn256 mlp128" runs only those rows (kind and batch), for a second look at one row in the same conditions.
ROWS=${ROWS:-}
for r in "mlp 32 300" "mlp 128 200" "mlp 512 100" "cnn 64 40" "cnn 256 20"; do
  set -- $r
  [ -z "$ROWS" ] || [[ " $ROWS " == *" $1$2 "* ]] && row "$@"
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
