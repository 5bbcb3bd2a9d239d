#!/usr/bin/env bash
# Superseded by compare_peers.sh, which measures Debian's PyTorch exactly as this script did (a loop over the real
# Fashion-MNIST tensors, torch threads {1,2} x OPENBLAS_NUM_THREADS {1,2} x glibc's malloc thresholds {default,
# raised}, fastest kept) and adds PyTorch 2, torch.compile, JAX and Keras when .venv-peers exists, FLOP counts and
# the fraction of the CPU's peak. Kept so the commands recorded in bench/results/ still run.
#   bench/step/compare_pytorch.sh [build-dir]
exec "$(dirname "$0")/compare_peers.sh" "$@"
