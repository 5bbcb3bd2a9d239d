#!/usr/bin/python3
"""PyTorch (Debian python3-torch) on samples/resnet_fashion_mnist.toml's recipe, for accuracy and time comparison:
the same ResNet (stem conv3x3-bn-relu, three basic blocks at 16/32/64 channels, stride 2 with a 1x1 conv + bn
projection where the shape changes, global average pooling, Linear(64, 10)), the same input pipeline (scale, normalize
with mean 0.2860 / std 0.3530; a horizontal flip for training), Adam lr 2e-3 (epsilon 1e-7, Kiln's default) with a
cosine decay to 0 over the run, batch 128.

Kiln pads "same" as TensorFlow does: a 3x3 convolution at stride 2 on 28 rows pads 0 rows before and 1 after, where
PyTorch's padding=1 pads one on each side and so samples other pixels; the strided convolutions here pad explicitly
(ZeroPad2d((0, 1, 0, 1))) so that this is the same model, weight for weight (bench/accuracy/resnet_equivalence.py
checks it step for step).

usage: /usr/bin/python3 bench/accuracy/torch_resnet_fashion_mnist.py [--epochs 10] [--threads 2] [--seed 0]
                                                        [--time-steps N]
"""
import argparse
import gzip
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
D = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"
MEAN, STD = 0.2860, 0.3530


def images(f):
    with gzip.open(D + f) as fh:
        x = np.frombuffer(fh.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28).astype(np.float32)
    # Kiln's map ops: scale by 1/255 (as a float32 factor), then (x - mean) / std
    x = x * np.float32(0.00392156862745098)
    return (x - np.float32(MEAN)) / np.float32(STD)


def labels(f):
    with gzip.open(D + f) as fh:
        return np.frombuffer(fh.read(), np.uint8, offset=8).astype(np.int64)


def conv3x3(cin, cout, stride):
    if stride == 1:
        return nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
    # TensorFlow's (and Kiln's) "same" at stride 2 on an even size: the extra padding row and column at the end
    return nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(cin, cout, 3, stride, 0, bias=False))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = conv3x3(cin, cout, stride)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = conv3x3(cout, cout, 1)
        self.b2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (self.proj(x) if self.proj is not None else x))


def make_model():
    return nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--time-steps", type=int, default=0,
                   help="only time this many training steps (after 5 warm-up steps) and print ms per step")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    xtr, ytr = torch.from_numpy(images("train-images-idx3-ubyte.gz")), torch.from_numpy(labels("train-labels-idx1-ubyte.gz"))
    xte, yte = torch.from_numpy(images("t10k-images-idx3-ubyte.gz")), torch.from_numpy(labels("t10k-labels-idx1-ubyte.gz"))
    model = make_model()
    batch = 128
    steps = a.epochs * math.ceil(len(xtr) / batch)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, eps=1e-7)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    lossf = nn.CrossEntropyLoss()

    def augment(x):
        out = x.clone()
        flip = torch.rand(x.shape[0]) < 0.5
        out[flip] = out[flip].flip(-1)
        return out

    if a.time_steps:
        model.train()
        for i in range(a.time_steps + 5):
            if i == 5:
                t0 = time.time()
            idx = torch.randint(len(xtr), (batch,))
            opt.zero_grad()
            lossf(model(augment(xtr[idx])), ytr[idx]).backward()
            opt.step()
        print(f"{1000 * (time.time() - t0) / a.time_steps:.1f} ms/step over {a.time_steps} steps, torch threads "
              f"{a.threads}", flush=True)
        return
    t0 = time.time()
    for ep in range(a.epochs):
        te = time.time()
        perm = torch.randperm(len(xtr))
        model.train()
        for i in range(0, len(xtr), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            loss = lossf(model(augment(xtr[idx])), ytr[idx])
            loss.backward()
            opt.step()
            sched.step()
        train_s = time.time() - te
        model.eval()
        with torch.no_grad():
            correct = sum((model(xte[j:j + 1000]).argmax(1) == yte[j:j + 1000]).sum().item()
                          for j in range(0, len(xte), 1000))
        print(f"epoch {ep + 1}: test accuracy {correct / len(xte):.4f}, epoch {time.time() - te:.1f} s "
              f"(training {train_s:.1f} s, {1000 * train_s / math.ceil(len(xtr) / batch):.1f} ms/step), "
              f"total {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
