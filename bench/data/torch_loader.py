#!/usr/bin/python3
"""PyTorch DataLoader on the same Fashion-MNIST data and transforms as kiln_data_bench, in samples/s.

    /usr/bin/python3 bench/data/torch_loader.py [--workers N] [--aug] [--batched] [--epochs N] [--batch B] [--threads T]
                                                [--data DIR]

Debian has no torchvision, so the dataset mirrors torchvision's FashionMNIST: the whole IDX file is decoded into
a uint8 tensor up front (not timed), and __getitem__ applies the per-example transforms with tensor ops:
x / 255, normalize(0.2860, 0.3530), and with --aug a random 28x28 crop of the image zero-padded by 2 and a
horizontal flip with probability 0.5 (what torchvision's RandomCrop(28, padding=2) and RandomHorizontalFlip do).
Tensor ops instead of PIL make this faster than torchvision's own path, so the comparison favours PyTorch.
One untimed epoch, then N timed epochs (shuffle=True, batch 128 by default), like the Kiln benchmark.
--threads is torch.set_num_threads in the main process (DataLoader's worker processes always use 1). The printed
line ends with the settings it ran under: torch threads, OPENBLAS_NUM_THREADS and glibc's malloc thresholds
(MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, "-" where unset); bench/data/run.sh tries them all.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy())


class FashionMNIST(Dataset):
    def __init__(self, root, aug):
        self.images = read_idx(f"{root}/train-images-idx3-ubyte.gz")
        self.labels = read_idx(f"{root}/train-labels-idx1-ubyte.gz").long()
        self.aug = aug

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.images[i].float().div_(255).unsqueeze_(0)
        x = (x - 0.2860) / 0.3530
        if self.aug:
            x = F.pad(x, (2, 2, 2, 2))
            oy, ox = torch.randint(0, 5, (2,)).tolist()
            x = x[:, oy:oy + 28, ox:ox + 28]
            if torch.rand(1).item() < 0.5:
                x = torch.flip(x, dims=[2])
        return x, self.labels[i]


class BatchedFashionMNIST(FashionMNIST):
    """--batched: __getitem__ takes a whole batch's indices (DataLoader with a BatchSampler and batch_size=None) and
    applies the same transforms to the batch at once; not torchvision's per-example idiom, but what a user who
    writes a batched dataset gets."""

    def __getitem__(self, idx):
        idx = torch.as_tensor(idx)
        x = self.images[idx].float().div_(255).unsqueeze_(1)
        x = (x - 0.2860) / 0.3530
        if self.aug:
            b = x.shape[0]
            x = F.pad(x, (2, 2, 2, 2))
            o = torch.randint(0, 5, (2, b))
            r = torch.arange(28)
            rows = (o[0, :, None] + r)[:, :, None]
            cols = (o[1, :, None] + r)[:, None, :]
            x = x[torch.arange(b)[:, None, None], 0, rows, cols].unsqueeze_(1)
            flip = torch.rand(b) < 0.5
            x = torch.where(flip[:, None, None, None], torch.flip(x, dims=[3]), x)
        return x, self.labels[idx]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--aug", action="store_true")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batched", action="store_true")
    ap.add_argument("--data", default=os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(1)
    if a.batched:
        ds = BatchedFashionMNIST(a.data, a.aug)
        dl = DataLoader(ds, batch_size=None, sampler=BatchSampler(RandomSampler(ds, generator=g), a.batch, False),
                        num_workers=a.workers, persistent_workers=a.workers > 0)
    else:
        ds = FashionMNIST(a.data, a.aug)
        dl = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                        persistent_workers=a.workers > 0, generator=g)

    def epoch():
        n, s = 0, 0.0
        for x, y in dl:
            n += x.shape[0]
            s += float(x[0, 0, 0, 0])
        return n

    epoch()
    t0 = time.perf_counter()
    n = sum(epoch() for _ in range(a.epochs))
    dt = time.perf_counter() - t0
    name = f"torch{'_batched' if a.batched else ''}{'_aug' if a.aug else ''}_w{a.workers}"
    env = os.environ.get
    print(f"{name:<20} {n / dt:12.0f} {dt / a.epochs:10.3f}   threads={a.threads} "
          f"openblas={env('OPENBLAS_NUM_THREADS', '-')} "
          f"malloc={env('MALLOC_MMAP_THRESHOLD_', '-')}/{env('MALLOC_TRIM_THRESHOLD_', '-')}")


if __name__ == "__main__":
    main()
