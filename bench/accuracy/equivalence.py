#!/usr/bin/python3
"""Continues Kiln's initial MLP weights in PyTorch for N Adam steps and compares with Kiln's weights after N steps."""
import gzip
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn


def load_checkpoint(path):
    b = open(path, "rb").read()
    assert b[:8] in (b"KILNCKP1", b"KILNCKP2"), "not a Kiln checkpoint"
    o = 8 + 16
    ds, = struct.unpack_from("<Q", b, o)
    o += 8 + ds
    n, = struct.unpack_from("<Q", b, o)
    o += 8
    out = {}
    for _ in range(n):
        ln, = struct.unpack_from("<I", b, o)
        o += 4
        name = b[o:o + ln].decode()
        o += ln
        r, = struct.unpack_from("<I", b, o)
        o += 4
        dims = struct.unpack_from("<%dq" % r, b, o)
        o += 8 * r
        cnt = int(np.prod(dims)) if r else 1
        out[name] = np.frombuffer(b, np.float32, cnt, o).reshape(dims).copy()
        o += 4 * cnt
    return out


def main():
    init, trained, steps = load_checkpoint(sys.argv[1]), load_checkpoint(sys.argv[2]), int(sys.argv[3])
    # Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
    D = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"
    x = np.frombuffer(gzip.open(D + "train-images-idx3-ubyte.gz").read(), np.uint8, offset=16).reshape(-1, 784)
    x = x[:6400].astype(np.float32) * np.float32(0.00392156862745098)
    y = np.frombuffer(gzip.open(D + "train-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)[:6400].astype(np.int64)
    m = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    names = ["dense_1", "dense_2", "dense_3"]
    with torch.no_grad():
        for i, nm in enumerate(names):
            m[2 * i].weight.copy_(torch.from_numpy(init[nm + ".kernel"].T))
            m[2 * i].bias.copy_(torch.from_numpy(init[nm + ".bias"]))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-7)
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    for s in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(m(X[32 * s:32 * s + 32]), Y[32 * s:32 * s + 32]).backward()
        opt.step()
    worst = 0.0
    for i, nm in enumerate(names):
        a, b = m[2 * i].weight.detach().numpy().T, trained[nm + ".kernel"]
        rel = np.linalg.norm(a - b) / np.linalg.norm(a)
        worst = max(worst, rel)
        print(f"after {steps} steps {nm}.kernel: max |kiln - torch| {np.abs(a - b).max():.3g}, relative {rel:.3g}")
    print(f"worst relative difference: {worst:.3g}")


if __name__ == "__main__":
    main()
