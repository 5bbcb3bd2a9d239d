#!/usr/bin/python3
"""Times PyTorch's training step for Kiln's samples (same models, batch, optimizer) as a user's training loop runs it:
over the real Fashion-MNIST training set held as tensors, a random batch gathered each step.

usage: /usr/bin/python3 bench/step/torch_step.py {mlp|cnn} BATCH [STEPS]
Thread settings come from the environment (OPENBLAS_NUM_THREADS, TORCH_THREADS), see compare_pytorch.sh, which also
runs it with glibc's malloc thresholds raised (MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864).

Until 2026-11-24 this script stepped on one fixed random batch with nothing else allocated. glibc's malloc then
serves PyTorch's per-step temporaries of about 1 MB with mmap/munmap, so every step page-faults: it timed PyTorch 3
to 5 times slower than a real training loop runs (bench/results/cpu_vs_pytorch.md keeps those rows, marked).
"""
import gzip
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
kind, batch = sys.argv[1], int(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 200

if kind == "mlp":
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
else:
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
# Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
D = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"
X = torch.frombuffer(bytearray(gzip.open(D + "train-images-idx3-ubyte.gz").read()[16:]), dtype=torch.uint8)
X = X.reshape(-1, 1, 28, 28).float().mul_(1.0 / 255)
Y = torch.frombuffer(bytearray(gzip.open(D + "train-labels-idx1-ubyte.gz").read()[8:]), dtype=torch.uint8).long()
g = torch.Generator().manual_seed(0)

times = []
for i in range(steps + 20):
    t0 = time.perf_counter()
    idx = torch.randint(0, X.shape[0], (batch,), generator=g)
    x, y = X[idx], Y[idx]
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    loss.item()
    dt = time.perf_counter() - t0
    if i >= 20:
        times.append(dt)
med = statistics.median(times)
print(f"torch {kind} batch {batch}: median {med*1e3:.3f} ms/step, {batch/med:.0f} examples/s "
      f"(torch threads {torch.get_num_threads()}, OPENBLAS_NUM_THREADS {os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
      f"MALLOC_MMAP_THRESHOLD_ {os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')})")
