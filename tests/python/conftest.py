"""Shared fixtures of the kiln package's tests: small Fashion-MNIST configs and the `kiln` app to compare with."""

import os
import subprocess
from pathlib import Path

import pytest

FMNIST = Path("/usr/share/datasets/fashion-mnist")
APP = os.environ.get("KILN_APP", "")


def write_mlp(dir: Path, name: str = "mlp", train_limit: int = 512, test_limit: int = 256, extra: str = "") -> Path:
    """The MLP sample (samples/fashion_mnist_mlp.toml) on the first examples of Fashion-MNIST, into `dir`."""
    if not (FMNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no Fashion-MNIST in {FMNIST} (Debian: apt-get install dataset-fashion-mnist)")
    p = dir / f"{name}.toml"
    p.write_text(f"""[run]
name = "{name}"
seed = 42

[device]
backend = "cpu"
memory_limit = "512MiB"

[model]
input_shape = [1, 28, 28]
loss = "softmax_cross_entropy"

[[model.layers]]
type = "flatten"

[[model.layers]]
type = "dense"
units = 64
activation = "relu"

[[model.layers]]
type = "dense"
units = 10

[optimizer]
type = "adam"
learning_rate = 1e-3

[train]
epochs = 1
batch_size = 32
output_dir = "{dir / 'runs' / name}"
{extra}
[data.train]
stages = [
  {{ type = "idx", images = "{FMNIST}/train-images-idx3-ubyte.gz", labels = "{FMNIST}/train-labels-idx1-ubyte.gz", limit = {train_limit} }},
  {{ type = "scale", factor = 0.00392156862745098 }},
  {{ type = "shuffle", buffer = 1024 }},
  {{ type = "batch" }},
]

[data.test]
stages = [
  {{ type = "idx", images = "{FMNIST}/t10k-images-idx3-ubyte.gz", labels = "{FMNIST}/t10k-labels-idx1-ubyte.gz", limit = {test_limit} }},
  {{ type = "scale", factor = 0.00392156862745098 }},
  {{ type = "batch" }},
]
""")
    return p


def kiln_app(*args: str) -> subprocess.CompletedProcess:
    assert APP and Path(APP).exists(), f"the kiln app is not at KILN_APP={APP!r}"
    return subprocess.run([APP, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture
def mlp(tmp_path):
    return write_mlp(tmp_path)
