#!/usr/bin/env bash
# Runs every peer once on the two reference cases (mlp batch 32, cnn batch 64): the step median, the thread settings
# tried for cnn 64, and one full epoch. Each command takes the build lock itself (bench/lock.sh), so others' builds
# can run in between and no timing overlaps one. Needs bench/peers/setup_peers.sh first.
#   bench/peers/run_peers.sh [step|epoch|all]   (default all)
# Environment (bench/common.sh): KILN_FASHION_MNIST, PYTHON (Debian's PyTorch 1.13), PEERS_PYTHON, KILN_BENCH_LOCK=0.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
P="$PEERS_PYTHON"
K="$LOCK"
M=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864)
what=${1:-all}
run() { echo "+ $*" >&2; "$K" env "$@" 2>&1 | grep -E '^(torch|jax|keras)|Error|error:' ; }
if [ "$what" != epoch ]; then
  run "${M[@]}" OPENBLAS_NUM_THREADS=1 TORCH_THREADS=2 "$PYTHON" bench/step/torch_step.py mlp 32 300
  run "${M[@]}" "$P" bench/peers/torch2_step.py mlp 32 300
  run "${M[@]}" "$P" bench/peers/torch2_step.py mlp 32 300 --compile
  run "${M[@]}" "$P" bench/peers/torch2_step.py mlp 32 300 --compile=step
  run "$P" bench/peers/jax_step.py mlp 32 300
  run "$P" bench/peers/keras_step.py mlp 32 300
  run "$P" bench/peers/keras_step.py mlp 32 300 --data tfdata
  run "$P" bench/peers/keras_step.py mlp 32 300 --jit
  for t in 1 2; do
    for ob in 1 2; do
      run "${M[@]}" OPENBLAS_NUM_THREADS=$ob TORCH_THREADS=$t "$PYTHON" bench/step/torch_step.py cnn 64 40
    done
    run "${M[@]}" TORCH_THREADS=$t "$P" bench/peers/torch2_step.py cnn 64 40
    run "${M[@]}" TORCH_THREADS=$t "$P" bench/peers/torch2_step.py cnn 64 40 --compile
    run JAX_THREADS=$t "$P" bench/peers/jax_step.py cnn 64 40
    run JAX_THREADS=$t "$P" bench/peers/jax_step.py cnn 64 40 --reshape-pool
    run TF_INTRA_THREADS=$t TF_INTER_THREADS=1 "$P" bench/peers/keras_step.py cnn 64 40
    run TF_INTRA_THREADS=$t TF_INTER_THREADS=2 "$P" bench/peers/keras_step.py cnn 64 40
  done
  run "${M[@]}" "$P" bench/peers/torch2_step.py cnn 64 40 --compile=step
  run "$P" bench/peers/keras_step.py cnn 64 40 --jit
fi
if [ "$what" != step ]; then
  # Debian's 1.13 with OpenBLAS's threads left at their default (2), oversubscribing the 2 cores:
  run "${M[@]}" TORCH_THREADS=2 "$PYTHON" bench/peers/torch_epoch.py mlp 32
  for c in "mlp 32" "cnn 64"; do
    for l in gather dataloader; do
      run "${M[@]}" OPENBLAS_NUM_THREADS=1 TORCH_THREADS=2 "$PYTHON" bench/peers/torch_epoch.py $c --loader $l
      run "${M[@]}" "$P" bench/peers/torch2_step.py $c --epoch --loader $l
    done
    run "${M[@]}" "$P" bench/peers/torch2_step.py $c --epoch --compile
    run "$P" bench/peers/jax_step.py $c --epoch
    [ "$c" = "cnn 64" ] && run "$P" bench/peers/jax_step.py $c --epoch --reshape-pool
    run "$P" bench/peers/keras_step.py $c --epoch
    run "$P" bench/peers/keras_step.py $c --epoch --data tfdata
  done
fi
