"""PyTorch's DataLoader on the samples' Fashion-MNIST pipelines, written as torchvision users write them, in
examples/s.

    .venv-peers/bin/python bench/data/torch_pipeline.py --pipeline mlp|resnet [--workers N] [--batched]
                                                        [--threads T] [--epochs N] [--data DIR]

A Dataset like torchvision's FashionMNIST (the gzip'd IDX files decompressed into a uint8 tensor in __init__, timed
as part of the build; torchvision is not installed, and its PIL path would be slower than these tensor ops), with
DataLoader(batch_size, shuffle=True, num_workers=N, persistent_workers=N > 0, pin_memory=False):
  mlp:    __getitem__ returns x / 255 (ToTensor's scaling), batch 64
  resnet: the scale and normalize are done once for the whole set in __init__ (what the other pipelines' cache
          holds), __getitem__ flips with probability 0.5 (RandomHorizontalFlip), batch 128
--batched: not torchvision's idiom but a few lines a user can write: __getitem__ takes a whole batch's indices
(DataLoader(batch_size=None, sampler=BatchSampler(RandomSampler(ds), B, False))) and transforms the batch at once.
--threads: torch.set_num_threads(T) in the main process (the workers' count is DataLoader's own: 1 each); default
torch's own (the cores).
"""
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from peer_common import MEAN, PIPELINES, STD, arguments, load_train, run


class FashionMNIST(Dataset):
    def __init__(self, root, pipeline):
        images, labels = load_train(root)
        self.images = torch.from_numpy(images.copy()).unsqueeze_(1)  # (N, 1, 28, 28) uint8
        self.labels = torch.from_numpy(labels.astype("int64"))
        self.pipeline = pipeline
        if pipeline == "resnet":
            self.images = self.images.float().div_(255).sub_(MEAN).div_(STD)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.pipeline == "mlp":
            return self.images[i].float().div_(255), self.labels[i]
        x = self.images[i]
        if torch.rand(1).item() < 0.5:
            x = x.flip(-1)
        return x, self.labels[i]


class BatchedFashionMNIST(FashionMNIST):
    def __getitem__(self, idx):
        idx = torch.as_tensor(idx)
        if self.pipeline == "mlp":
            return self.images[idx].float().div_(255), self.labels[idx]
        x = self.images[idx]
        flip = torch.rand(len(idx)) < 0.5
        return torch.where(flip[:, None, None, None], x.flip(-1), x), self.labels[idx]


def main():
    def extra(ap):
        ap.add_argument("--workers", type=int, default=0)
        ap.add_argument("--batched", action="store_true")
        ap.add_argument("--threads", type=int, default=0)

    a = arguments(extra)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)

    def make():
        b = PIPELINES[a.pipeline]["batch"]
        if a.batched:
            ds = BatchedFashionMNIST(a.data, a.pipeline)
            return DataLoader(ds, batch_size=None, sampler=BatchSampler(RandomSampler(ds), b, False),
                              num_workers=a.workers, persistent_workers=a.workers > 0, pin_memory=False)
        ds = FashionMNIST(a.data, a.pipeline)
        return DataLoader(ds, batch_size=b, shuffle=True, num_workers=a.workers, persistent_workers=a.workers > 0,
                          pin_memory=False)

    def epoch(dl):
        n = 0
        for x, _ in dl:
            n += x.shape[0]
        return n

    run(f"torch {a.pipeline}{' batched' if a.batched else ''} w{a.workers} t{torch.get_num_threads()}", make, epoch, a.epochs,
        f"PyTorch {torch.__version__}, DataLoader num_workers={a.workers}, torch threads {torch.get_num_threads()}, "
        f"batch {PIPELINES[a.pipeline]['batch']}")


if __name__ == "__main__":
    main()
