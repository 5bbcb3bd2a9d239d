#!/usr/bin/python3
"""PyTorch (Debian python3-torch) on Kiln's Fashion-MNIST sample recipes, for accuracy and time comparison.

usage: /usr/bin/python3 bench/accuracy/torch_fashion_mnist.py {mlp|cnn} [--init keras|torch] [--seed N]
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("kind", choices=["mlp", "cnn"])
p.add_argument("--init", choices=["keras", "torch"], default="torch")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()
torch.manual_seed(a.seed)
torch.set_num_threads(a.threads)

# Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
D = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"
def images(f):
    with gzip.open(D + f) as fh:
        return np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
def labels(f):
    with gzip.open(D + f) as fh:
        return np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)
xtr, ytr = torch.from_numpy(images("train-images-idx3-ubyte.gz")), torch.from_numpy(labels("train-labels-idx1-ubyte.gz"))
xte, yte = torch.from_numpy(images("t10k-images-idx3-ubyte.gz")), torch.from_numpy(labels("t10k-labels-idx1-ubyte.gz"))

if a.kind == "mlp":
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    batch = 32
else:
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    batch = 64
if a.init == "keras":
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
lossf = nn.CrossEntropyLoss()
t0 = time.time()
for ep in range(a.epochs):
    perm = torch.randperm(len(xtr))
    model.train()
    for i in range(0, len(xtr), batch):
        idx = perm[i:i + batch]
        opt.zero_grad()
        l = lossf(model(xtr[idx]), ytr[idx])
        l.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    print(f"torch {a.kind} init={a.init} seed={a.seed} epoch {ep+1}: test accuracy {acc:.4f}, {time.time()-t0:.1f} s")
