#!/usr/bin/env bash
# Creates .venv-peers in the repository (from $PYTHON, default Debian's /usr/bin/python3 3.11) with the peers the step
# benchmarks compare against: PyTorch 2 (PyPI wheel; it pulls the nvidia-*/cuda-* packages, about 5 GB, unused on
# CPU), JAX (CPU) + optax, TensorFlow (tensorflow-cpu, with Keras 3). Idempotent: does nothing but print versions when
# the pins are installed. The bench scripts use it as PEERS_PYTHON (default .venv-peers/bin/python).
#   bench/lock.sh bench/peers/setup_peers.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
V=.venv-peers
PINS=(torch==2.15.0 "jax[cpu]==0.10.2" jaxlib==0.10.2 optax==0.2.8 tensorflow-cpu==2.21.0 keras==3.15.1)
if ! dpkg -s python3-venv >/dev/null 2>&1; then apt-get install -y python3-venv; fi
[ -x "$V/bin/python" ] || "$PYTHON" -m venv "$V"
if "$V/bin/python" - "${PINS[@]}" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
for p in sys.argv[1:]:
    name, want = p.split("==")
    try:
        if version(name.split("[")[0]) != want: sys.exit(1)
    except PackageNotFoundError: sys.exit(1)
PY
then echo "peers already installed in $V"
else "$V/bin/pip" install --upgrade "${PINS[@]}"
fi
"$V/bin/python" - <<'PY'
from importlib.metadata import version
print("python", __import__("sys").version.split()[0], "|",
      ", ".join(f"{p} {version(p)}" for p in ["torch", "jax", "jaxlib", "optax", "tensorflow-cpu", "keras", "numpy"]))
PY
