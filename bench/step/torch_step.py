#!/usr/bin/python3
"""Times PyTorch's training step for Kiln's samples (same models, batch, optimizer, random data).

usage: /usr/bin/python3 bench/step/torch_step.py {mlp|cnn} BATCH [STEPS]
Thread settings come from the environment (OPENBLAS_NUM_THREADS, TORCH_THREADS), see compare_pytorch.sh.
"""
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
x = torch.rand(batch, 1, 28, 28)
y = torch.randint(0, 10, (batch,))

times = []
for i in range(steps + 20):
    t0 = time.perf_counter()
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
      f"(torch threads {torch.get_num_threads()}, OPENBLAS_NUM_THREADS {os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
