"""What bench/data/tf_pipeline.py and torch_pipeline.py share: reading Fashion-MNIST's gzip'd IDX files as the
peers' users do (keras.datasets.fashion_mnist.load_data and torchvision's FashionMNIST both decompress the whole
file and view it as uint8 with numpy), the arguments, and the timed epochs, printed in kiln_data_bench's format:

    PEER LABEL: ..., built in B s
    PEER LABEL epoch 1: N examples in S s, R examples/s (with the build: R1 examples/s)
    PEER LABEL epoch 2: N examples in S s, R examples/s

"Built" is everything before the first epoch's loop: reading and decompressing the files and making the pipeline
(a DataLoader's worker processes start in epoch 1, a tf.function traces in epoch 1). Nothing a user's loop pays is
left out: epoch 1 "with the build" is what a training run pays before its second epoch.
"""
import argparse
import gzip
import os
import time

import numpy as np

# The two pipelines, as the samples' [data.train] sections define them (see bench/data/compare_peers.sh).
PIPELINES = {
    # samples/fashion_mnist_mlp.toml's section (idx > scale 1/255 > shuffle 60000 > batch), at batch 64
    "mlp": {"batch": 64},
    # samples/resnet_fashion_mnist.toml's (idx > map(scale, normalize 0.2860/0.3530) > cache > map(flip 0.5) >
    # shuffle 60000 > batch > prefetch 2), batch 128
    "resnet": {"batch": 128},
}
MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_train(root):
    """(images uint8 (60000, 28, 28), labels uint8 (60000,))"""
    return (read_idx(f"{root}/train-images-idx3-ubyte.gz"), read_idx(f"{root}/train-labels-idx1-ubyte.gz"))


def arguments(extra=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", choices=sorted(PIPELINES), required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data", default=os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
    if extra:
        extra(ap)
    return ap.parse_args()


def run(label, build, epoch, epochs, describe):
    """build() -> state (timed as the build); epoch(state) -> examples (timed per epoch)."""
    t0 = time.perf_counter()
    state = build()
    tb = time.perf_counter() - t0
    print(f"{label}: {describe}, built in {tb:.3f} s", flush=True)
    for e in range(1, epochs + 1):
        t0 = time.perf_counter()
        n = epoch(state)
        dt = time.perf_counter() - t0
        line = f"{label} epoch {e}: {n} examples in {dt:.3f} s, {n / dt:.0f} examples/s"
        if e == 1:
            line += f" (with the build: {n / (dt + tb):.0f} examples/s)"
        print(line, flush=True)
