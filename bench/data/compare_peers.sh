#!/usr/bin/env bash
# Kiln's input pipeline against tf.data and PyTorch's DataLoader on the samples' two Fashion-MNIST pipelines, in the
# same run, alternating, examples/s per epoch.
#   bench/data/compare_peers.sh [build-dir] [rounds] [epochs]     (defaults: build 3 3; ~10 minutes on 2 cores)
# Pipelines (the samples' [data.train] sections; bench/data/peer_common.py restates them for the peers):
#   mlp:    samples/fashion_mnist_mlp.toml's section at batch 64 (idx > scale > shuffle(60000) > batch)
#   resnet: samples/resnet_fashion_mnist.toml's (idx > map(scale, normalize) > cache > map(flip) > shuffle(60000) >
#           batch(128) > prefetch(2))
# Kiln runs through kiln_data_bench on the sample files themselves (the pipeline `kiln train` builds). The peers:
#   tf.data (tf_pipeline.py): keras-style load, map(AUTOTUNE) > cache() > shuffle > batch > prefetch(AUTOTUNE), read
#     by an eager Python loop and inside a tf.function; for resnet also with the flip vectorized after batch().
#     TensorFlow (tensorflow-cpu from pip) lives in .venv-tf, which this script creates when it is missing.
#   PyTorch (torch_pipeline.py, $PEERS_PYTHON = .venv-peers): DataLoader with num_workers 0, 1 and 2, pin_memory off,
#     and a batched __getitem__ with 0 workers; each at torch threads 1 and 2, with glibc's malloc thresholds raised
#     (MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864).
# Each round runs every command once, each under bench/lock.sh, in an order rotated from round to round. Every epoch
# is counted whole: the build (reading and decompressing the gzip files, making the pipeline) is reported apart, and
# "epoch 1 + build" is what a training loop pays before its second epoch. At the end: for each pipeline and peer,
# the range (min-max over rounds) and median of epoch 1 + build, and of the later epochs, then Kiln's ratio to the
# fastest peer (by median).
# Environment: KILN_FASHION_MNIST, PEERS_PYTHON (bench/common.sh); TF_PYTHON (default .venv-tf/bin/python);
# PIPELINES (default "mlp resnet"); LOG (keep the raw lines in this file).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
B="${1:-build}"
R="${2:-3}"
E="${3:-3}"
TF_PYTHON="${TF_PYTHON:-.venv-tf/bin/python}"
PIPELINES="${PIPELINES:-mlp resnet}"
LOG="${LOG:-$(mktemp)}"
: > "$LOG"

if [ ! -x "$TF_PYTHON" ]; then
  echo "# making .venv-tf (tensorflow-cpu from pip)" >&2
  python3 -m venv .venv-tf
  .venv-tf/bin/pip install -q "tensorflow-cpu==2.21.0"
  TF_PYTHON=.venv-tf/bin/python
fi
[ -x "$B/bin/kiln_data_bench" ] || { echo "no $B/bin/kiln_data_bench: tools/kbuild kiln_data_bench" >&2; exit 2; }

kiln_cmd() {  # pipeline
  local cfg sets=()
  case "$1" in
    mlp) cfg=samples/fashion_mnist_mlp.toml sets=(--set train.batch_size=64) ;;
    resnet) cfg=samples/resnet_fashion_mnist.toml ;;
  esac
  mapfile -t ds < <(data_sets "$cfg")
  echo "$B/bin/kiln_data_bench $cfg ${sets[*]} ${ds[*]} --epochs $E --label $1"
}

# PyTorch as its users are told to run it on CPU: glibc's malloc thresholds raised, torch threads 1 and 2 tried.
TORCH_ENV="env MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864"
commands=()
for p in $PIPELINES; do
  commands+=("$(kiln_cmd "$p")")
  commands+=("$TF_PYTHON bench/data/tf_pipeline.py --pipeline $p --consumer eager --epochs $E")
  commands+=("$TF_PYTHON bench/data/tf_pipeline.py --pipeline $p --consumer graph --epochs $E")
  [ "$p" = resnet ] && commands+=("$TF_PYTHON bench/data/tf_pipeline.py --pipeline $p --consumer graph --vectorized --epochs $E")
  for t in 1 2; do
    for w in 0 1 2; do
      commands+=("$TORCH_ENV $PEERS_PYTHON bench/data/torch_pipeline.py --pipeline $p --workers $w --threads $t --epochs $E")
    done
    commands+=("$TORCH_ENV $PEERS_PYTHON bench/data/torch_pipeline.py --pipeline $p --batched --workers 0 --threads $t --epochs $E")
  done
done

n=${#commands[@]}
for ((r = 0; r < R; r++)); do
  echo "# round $((r + 1)) of $R, $(date -u '+%F %T') UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"
  for ((i = 0; i < n; i++)); do
    c="${commands[$(((i + r) % n))]}"
    echo "\$ $c" | tee -a "$LOG"
    # shellcheck disable=SC2086  # each command is a word list
    TF_CPP_MIN_LOG_LEVEL=2 "$LOCK" $c 2>&1 | grep -E '^(kiln|tf\.data|torch) [^ ]+.*(epoch [0-9]+:|built in)' | tee -a "$LOG"
  done
done

python3 - "$LOG" <<'EOF'
import re
import statistics
import sys
from collections import defaultdict

first, later = defaultdict(list), defaultdict(list)  # (pipeline, peer) -> examples/s
line_re = re.compile(r"^(kiln|tf\.data|torch) (\S+)(.*) epoch (\d+): \d+ examples in [\d.]+ s, (\d+) examples/s"
                     r"(?: \(with the build: (\d+) examples/s\))?")
for line in open(sys.argv[1]):
    m = line_re.match(line)
    if not m:
        continue
    peer, pipeline, rest, epoch, rate, with_build = m.groups()
    if peer == "kiln":  # the label is the pipeline
        rest = ""
    key = (pipeline, f"{peer}{rest}")
    if epoch == "1":
        first[key].append(float(with_build))
    else:
        later[key].append(float(rate))

def fmt(v):
    return f"{min(v):>9,.0f}-{max(v):<9,.0f} {statistics.median(v):>9,.0f}" if v else "-"

print("\nexamples/s: range over rounds (min-max) and median; 'later' pools epochs 2.. of every round")
print(f"{'pipeline':<8} {'who':<28} {'epoch 1 + build':>29} {'later epochs':>29}")
for pipeline in sorted({k[0] for k in first}):
    keys = sorted((k for k in first if k[0] == pipeline), key=lambda k: (k[1] != "kiln", k[1]))
    for k in keys:
        print(f"{pipeline:<8} {k[1]:<28} {fmt(first[k]):>29} {fmt(later[k]):>29}")
    kiln = (pipeline, "kiln")
    if kiln not in first:
        continue
    for name, table in (("epoch 1 + build", first), ("later epochs", later)):
        peers = [k for k in keys if k != kiln and table[k]]
        if not peers or not table[kiln]:
            continue
        best = max(peers, key=lambda k: statistics.median(table[k]))
        ratio = statistics.median(table[kiln]) / statistics.median(table[best])
        lo = min(table[kiln]) / max(table[best])
        hi = max(table[kiln]) / min(table[best])
        print(f"  {pipeline} {name}: Kiln / fastest peer ({best[1]}) = {ratio:.2f}x median "
              f"({lo:.2f}x-{hi:.2f}x worst to best)")
EOF
echo "raw lines: $LOG"
