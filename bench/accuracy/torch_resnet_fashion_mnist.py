#!/usr/bin/python3
"""PyTorch (Debian python3-torch) on samples/resnet_fashion_mnist.toml's recipe, for accuracy and time comparison:
the same ResNet (stem conv3x3-bn-relu, three basic blocks at 16/32/64 channels, stride 2 with a 1x1 conv + bn
projection where the shape changes, global average pooling, Linear(64, 10)), the same input pipeline (scale, normalize
with mean 0.2860 / std 0.3530; a horizontal flip for training), Adam lr 2e-3 with a
cosine decay to 0 over the run, batch 128.

usage: /usr/bin/python3 bench/accuracy/torch_resnet_fashion_mnist.py [--epochs 8] [--threads 2] [--seed 0]
"""
import argparse
import gzip
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, default=0)
p.add_argument("--epochs", type=int, default=8)
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()
torch.manual_seed(a.seed)
torch.set_num_threads(a.threads)

D = "/usr/share/datasets/fashion-mnist/"
def images(f):
    with gzip.open(D + f) as fh:
        x = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    return (x - 0.2860) / 0.3530
def labels(f):
    with gzip.open(D + f) as fh:
        return np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)
xtr, ytr = torch.from_numpy(images("train-images-idx3-ubyte.gz")), torch.from_numpy(labels("train-labels-idx1-ubyte.gz"))
xte, yte = torch.from_numpy(images("t10k-images-idx3-ubyte.gz")), torch.from_numpy(labels("t10k-labels-idx1-ubyte.gz"))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (self.proj(x) if self.proj is not None else x))


model = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                      Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
batch = 128
steps = a.epochs * math.ceil(len(xtr) / batch)
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
lossf = nn.CrossEntropyLoss()


def augment(x):
    n = x.shape[0]
    out = x.clone()
    flip = torch.rand(n) < 0.5
    out[flip] = out[flip].flip(-1)
    return out


t0 = time.time()
for ep in range(a.epochs):
    perm = torch.randperm(len(xtr))
    model.train()
    for i in range(0, len(xtr), batch):
        idx = perm[i:i + batch]
        opt.zero_grad()
        l = lossf(model(augment(xtr[idx])), ytr[idx])
        l.backward()
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        correct = sum((model(xte[j:j + 1000]).argmax(1) == yte[j:j + 1000]).sum().item() for j in range(0, len(xte), 1000))
    print(f"epoch {ep + 1}: test accuracy {correct / len(xte):.4f}, {time.time() - t0:.1f} s", flush=True)
