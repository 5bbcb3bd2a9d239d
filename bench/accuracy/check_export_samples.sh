#!/bin/bash
# Trains four samples briefly and checks their exports with bench/accuracy/check_export.py (results:
# bench/results/export.md). Usage: bench/accuracy/check_export_samples.sh [python] [workdir]
#   python: one with torch, safetensors, onnx and onnxruntime (default .venv-export/bin/python; docs/user_guide.md)
# Environment (bench/common.sh): KILN_FASHION_MNIST.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
K=build/bin/kiln
PY=${1:-.venv-export/bin/python}
W=${2:-/tmp/kiln-export-check}
rm -rf "$W"
mkdir -p "$W"
for spec in "fashion_mnist_mlp 200 --examples 1000" "fashion_mnist_cnn 50 --examples 1000" \
  "resnet_fashion_mnist 50 --examples 500" "shakespeare_char 30 --inputs ids --examples 64"; do
  set -- $spec
  s=$1 n=$2
  shift 2
  mapfile -t ds < <(data_sets "samples/$s.toml")
  $K train samples/$s.toml "${ds[@]}" --set train.max_steps=$n --set 'train.progress="none"' --set "train.output_dir=\"$W/$s\"" \
    >"$W/$s.train.log" 2>&1
  echo "== $s ($n steps)"
  "$PY" bench/accuracy/check_export.py --kiln $K --config samples/$s.toml --checkpoint "$W/$s/checkpoint.kiln" \
    --workdir "$W/check_$s" "$@" 2>&1 | grep -E "max \|diff\||argmax|^OK|FAILED"
done
