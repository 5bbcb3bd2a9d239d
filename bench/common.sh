# Sourced by the bench scripts (bash, from the repository root): the settings every script shares, each one an
# environment variable with the value this repository's results were measured with as its default.
#   KILN_FASHION_MNIST  directory of Fashion-MNIST's four .gz files (default Debian's dataset-fashion-mnist,
#                       /usr/share/datasets/fashion-mnist, which the samples name)
#   PYTHON              the Python with Debian's PyTorch 1.13 that the PyTorch peers and the scripts' helpers run on
#                       (default /usr/bin/python3)
#   PEERS_PYTHON        the Python with PyTorch 2, JAX and Keras (default .venv-peers/bin/python, made by
#                       bench/peers/setup_peers.sh)
#   KILN_BENCH_LOCK=0   run timed commands without bench/lock.sh's lock
KILN_FASHION_MNIST_DEFAULT=/usr/share/datasets/fashion-mnist
KILN_FASHION_MNIST="${KILN_FASHION_MNIST:-$KILN_FASHION_MNIST_DEFAULT}"
KILN_FASHION_MNIST="${KILN_FASHION_MNIST%/}"
PYTHON="${PYTHON:-/usr/bin/python3}"
PEERS_PYTHON="${PEERS_PYTHON:-.venv-peers/bin/python}"
# The lock every timed command runs under, so that a build or another timing on a shared machine never overlaps it.
LOCK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lock.sh"
# The Python peer scripts read the data set's directory from the environment.
export KILN_FASHION_MNIST

# data_sets CONFIG: the --set arguments (one per line) that point every data path of CONFIG under Debian's
# Fashion-MNIST directory at $KILN_FASHION_MNIST instead; nothing when that is the default. The samples name Debian's
# path; this lets them run on a machine that keeps the data set elsewhere. Use: mapfile -t ds < <(data_sets "$cfg").
data_sets() {
  [ "$KILN_FASHION_MNIST" = "$KILN_FASHION_MNIST_DEFAULT" ] && return 0
  python3 - "$1" "$KILN_FASHION_MNIST_DEFAULT" "$KILN_FASHION_MNIST" <<'PY'
import sys
try:
    import tomllib
except ImportError:  # Python before 3.11
    import tomli as tomllib
config, default, there = sys.argv[1:]
with open(config, "rb") as f:
    data = tomllib.load(f).get("data", {})
for pipeline, table in data.items():
    for i, stage in enumerate(table.get("stages", [])):
        for key, value in stage.items():
            if isinstance(value, str) and value.startswith(default + "/"):
                print("--set")
                print(f'data.{pipeline}.stages[{i}].{key}="{there}{value[len(default):]}"')
PY
}
