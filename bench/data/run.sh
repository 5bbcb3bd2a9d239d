#!/usr/bin/env bash
# Kiln's data pipeline against PyTorch's DataLoader on Fashion-MNIST (Debian dataset-fashion-mnist), samples/s.
#   bench/data/run.sh [build-dir] [epochs]
# Needs BUILD/bin/kiln_data_bench (cmake --build BUILD --target kiln_data_bench) and /usr/bin/python3 with torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
B="${1:-build}"
E="${2:-3}"
"$B/bin/kiln_data_bench" --epochs "$E"
for w in 0 1 2; do /usr/bin/python3 bench/data/torch_loader.py --workers "$w" --epochs "$E"; done
for w in 0 2; do /usr/bin/python3 bench/data/torch_loader.py --workers "$w" --aug --epochs "$E"; done
