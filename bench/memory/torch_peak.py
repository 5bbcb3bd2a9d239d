#!/usr/bin/python3
"""Peak resident memory of the same training steps as Kiln's samples, in PyTorch on the CPU.

Usage: /usr/bin/python3 bench/memory/torch_peak.py {mlp|cnn|deep} STEPS
Prints one line: model=... steps=... loss=... rss_after_import_mib=... rss_after_data_mib=... loading_peak_mib=...
train_peak_mib=... peak_rss_mib=... seconds=... malloc=...
  peak_rss_mib       the whole process's peak (ru_maxrss; max of the two below), what /usr/bin/time reports for Kiln
  loading_peak_mib   the peak before the first step (import, reading the data set, building the model)
  rss_after_data_mib the resident set once the data set is in memory (not a peak)
  train_peak_mib     the peak during the training steps alone (VmHWM reset through /proc/self/clear_refs first)
  malloc             glibc's MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ from the environment, "default" if unset
The models, batch sizes, optimizers and data mirror samples/fashion_mnist_{mlp,cnn}.toml and samples/seed_deep_conv.toml.
"""
import gzip
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn

# Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
FM = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def status_mib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def reset_peak():  # VmHWM := VmRSS (Linux >= 4.0); this resets ru_maxrss's source too, so keep the peak before it
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def fashion():
    x = torch.from_numpy(idx(FM + "train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0)
    y = torch.from_numpy(idx(FM + "train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    return x, y


def conv(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]


def build(name):
    if name == "mlp":
        m = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        return m, torch.optim.Adam(m.parameters(), lr=1e-3), nn.CrossEntropyLoss(), 32
    if name == "cnn":
        m = nn.Sequential(*conv(1, 32), nn.MaxPool2d(2), *conv(32, 64), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
        return m, torch.optim.Adam(m.parameters(), lr=1e-3), nn.CrossEntropyLoss(), 64
    layers = conv(1, 256) + [nn.MaxPool2d(2)] + conv(256, 512) + [nn.MaxPool2d(2)] + conv(512, 1024)
    for _ in range(21):
        layers += conv(1024, 1024)
    layers += [nn.MaxPool2d(2)] + conv(1024, 256) + conv(256, 32) + [nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32, 4), nn.ReLU(),
                                                                     nn.Linear(4, 1)]
    m = nn.Sequential(*layers)
    assert sum(p.numel() for p in m.parameters()) == 206538153
    return m, torch.optim.SGD(m.parameters(), lr=1e-4), nn.MSELoss(), 1


def main():
    name, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(2)
    torch.manual_seed(0)
    after_import = rss_mib()
    if name == "deep":
        g = torch.Generator().manual_seed(11)
        x = torch.randn(64, 1, 16, 16, generator=g)
        y = torch.randint(0, 2, (64, 1), generator=g).float()
    else:
        x, y = fashion()
    after_data = status_mib("VmRSS")
    model, opt, loss_fn, batch = build(name)
    loading_peak = rss_mib()
    reset_peak()
    t0 = time.time()
    perm = torch.randperm(x.shape[0])
    for s in range(steps):
        i = perm[(s * batch) % x.shape[0]:][:batch]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[i]), y[i])
        loss.backward()
        opt.step()
    seconds = time.time() - t0
    train_peak = status_mib("VmHWM")
    mm, tr = os.environ.get("MALLOC_MMAP_THRESHOLD_"), os.environ.get("MALLOC_TRIM_THRESHOLD_")
    print(f"model={name} steps={steps} loss={loss.item():.4f} rss_after_import_mib={after_import:.1f} "
          f"rss_after_data_mib={after_data:.1f} loading_peak_mib={loading_peak:.1f} train_peak_mib={train_peak:.1f} "
          f"peak_rss_mib={max(loading_peak, rss_mib()):.1f} seconds={seconds:.1f} malloc={f'{mm}/{tr}' if mm or tr else 'default'}")


if __name__ == "__main__":
    main()
