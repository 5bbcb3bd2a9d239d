#!/usr/bin/python3
"""One training epoch of PyTorch over the 60000 Fashion-MNIST training images, as a user's loop runs it, with the
models, optimizer and data of bench/step/torch_step.py. Works with Debian's PyTorch 1.13 (/usr/bin/python3) and with
PyTorch 2 (.venv-peers/bin/python, which also gets --compile). torch2_step.py imports its pieces.

usage: [python] bench/peers/torch_epoch.py {mlp|cnn} BATCH [--loader gather|dataloader] [--compile[=model|step]]
  --loader gather      (default, the faster here) a torch.randperm each epoch, each step gathers X[idx], Y[idx]
  --loader dataloader  DataLoader(TensorDataset(X, Y), batch_size, shuffle=True, drop_last=True)
Full batches only (drop_last): 60000 // BATCH steps. 5 warm-up steps run before the timed epoch (their time, which
holds torch.compile's compilation, is printed as "warm-up"). Threads: TORCH_THREADS (default 2); Debian's 1.13 also
calls OpenBLAS, whose own threads (OPENBLAS_NUM_THREADS, unset = 2) oversubscribe the 2 cores with TORCH_THREADS=2:
its median step hardly moves but the mean, so the epoch, is 2-3x slower. Use OPENBLAS_NUM_THREADS=1 with it.
"""
import gzip
import os
import sys
import time

import torch
import torch.nn as nn

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
VERSION = ".".join(torch.__version__.split(".")[:2])


def build(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def load():
    # Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
    D = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"
    X = torch.frombuffer(bytearray(gzip.open(D + "train-images-idx3-ubyte.gz").read()[16:]), dtype=torch.uint8)
    X = X.reshape(-1, 1, 28, 28).float().mul_(1.0 / 255)
    Y = torch.frombuffer(bytearray(gzip.open(D + "train-labels-idx1-ubyte.gz").read()[8:]), dtype=torch.uint8).long()
    return X, Y


def make_step(model, compile_mode, amp=None):
    """compile_mode None: eager; "model": torch.compile(model); "step": torch.compile of forward+loss+backward+Adam.
    amp "bf16": forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), as PyTorch's AMP recipe runs it
    (float32 master weights; bfloat16 needs no GradScaler)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = nn.CrossEntropyLoss()
    fwd = torch.compile(model) if compile_mode == "model" else model

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
            loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
        return loss
    return torch.compile(step) if compile_mode == "step" else step


def parse_compile(args):
    for a in args:
        if a.startswith("--compile"):
            return a.split("=", 1)[1] if "=" in a else "model"
    return None


def run_epoch(kind, batch, loader, compile_mode):
    model = build(kind)
    step = make_step(model, compile_mode)
    X, Y = load()
    g = torch.Generator().manual_seed(0)
    n = X.shape[0] // batch
    if loader == "dataloader":
        dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=batch, shuffle=True,
                                         drop_last=True, generator=g)
        batches = lambda: iter(dl)
    else:
        def batches():
            perm = torch.randperm(X.shape[0], generator=g)
            for i in range(n):
                idx = perm[i * batch:(i + 1) * batch]
                yield X[idx], Y[idx]
    t0 = time.perf_counter()
    for _, (x, y) in zip(range(5), batches()):
        step(x, y).item()
    warm = time.perf_counter() - t0
    c0, t0 = time.process_time(), time.perf_counter()
    steps = 0
    for x, y in batches():
        loss = step(x, y).item()
        steps += 1
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    peer = f"torch{VERSION}" + ("+compile" if compile_mode else "")
    print(f"{peer} {kind} batch {batch}: epoch {dt:.2f} s ({steps} steps, {steps * batch / dt:.0f} examples/s, "
          f"loader {loader}, warm-up 5 steps {warm:.2f} s, compile {compile_mode or 'none'}, "
          f"torch threads {torch.get_num_threads()}, cpu/wall {cpu / dt:.2f}, last loss {loss:.3f}, "
          f"OPENBLAS_NUM_THREADS {os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
          f"MALLOC_MMAP_THRESHOLD_ {os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')})")


if __name__ == "__main__":
    a = sys.argv[1:]
    loader = a[a.index("--loader") + 1] if "--loader" in a else "gather"
    run_epoch(a[0], int(a[1]), loader, parse_compile(a))
