#!/usr/bin/python3
"""PyTorch's time to the first training step of samples/seed_deep_conv.toml's model (206.5M parameters):
from the interpreter's start (import torch included) to the start of the first step, then the step time.
  MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864 /usr/bin/python3 bench/startup/torch_seed_deep_conv.py
Compare with `kiln train samples/seed_deep_conv.toml` ("first step began X s after start")."""
import os
import time

import psutil  # noqa: F401  (only for the process start time)
start = psutil.Process(os.getpid()).create_time()
import torch
import torch.nn as nn

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
c = lambda i, o: [nn.Conv2d(i, o, 3, padding=1), nn.ReLU()]
layers = c(1, 256) + [nn.MaxPool2d(2)] + c(256, 512) + [nn.MaxPool2d(2)]
layers += c(512, 1024) + sum((c(1024, 1024) for _ in range(21)), [])
layers += [nn.MaxPool2d(2)] + c(1024, 256) + c(256, 32) + [nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32, 4), nn.Linear(4, 1)]
model = nn.Sequential(*layers)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x, y = torch.rand(1, 1, 16, 16), torch.rand(1, 1)
first = time.time() - start
times = []
for i in range(5):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - t0)
n = sum(p.numel() for p in model.parameters())
print(f"torch seed_deep_conv ({n} parameters): first step began {first:.2f} s after start; "
      f"steps {' '.join(f'{t:.3f}' for t in times)} s (torch threads {torch.get_num_threads()})")
