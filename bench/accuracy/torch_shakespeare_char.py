#!/usr/bin/python3
"""nanoGPT's shakespeare_char CPU configuration in PyTorch, as nanoGPT's README runs it on a laptop:

  python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1
         --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
         --dropout=0.0

The model is nanoGPT's model.py with bias=False (no biases in linear and LayerNorm layers), tied token-embedding and
output weights, N(0, 0.02) init and 0.02/sqrt(2 n_layer) for the residual projections; train.py's AdamW (decay 0.1 on
parameters of rank >= 2, betas (0.9, 0.99)), linear warmup over 100 iterations, cosine decay to 1e-4 at 2000, global
gradient-norm clipping at 1.0, and get_batch's random windows; the validation loss is the mean over 20 random batches,
every 250 iterations. Data: samples/data/tinyshakespeare/input.txt, encoded as data/shakespeare_char/prepare.py does
(sorted characters, first 90% train, last 10% validation).

  bench/accuracy/torch_shakespeare_char.py [--threads N] [--iters 2000] [--seed 1337] [--final-eval-iters 200]

Prints the validation loss at every evaluation, the wall time of the whole run and per iteration. Kiln's run of the
same configuration is samples/shakespeare_char.toml (bench/accuracy/shakespeare_char.sh runs both)."""
import argparse
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../samples/data/tinyshakespeare/input.txt")


def load_data(path=DATA):  # data/shakespeare_char/prepare.py
    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = len(ids)
    return ids[: int(n * 0.9)], ids[int(n * 0.9):], len(chars)


block_size, batch_size, n_layer, n_head, n_embd = 64, 12, 4, 4, 128
vocab_size = 65
learning_rate, min_lr, warmup_iters, lr_decay_iters = 1e-3, 1e-4, 100, 2000
weight_decay, beta1, beta2, grad_clip = 1e-1, 0.9, 0.99, 1.0
eval_interval, eval_iters = 250, 20


def get_batch(data):  # train.py's get_batch (memmap + random offsets)
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


class LayerNorm(nn.Module):  # model.py: LayerNorm with an optional bias
    def __init__(self, ndim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = LayerNorm(n_embd), CausalSelfAttention(), LayerNorm(n_embd), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_optimizer(model):  # model.py's configure_optimizers
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    nodecay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}],
                             lr=learning_rate, betas=(beta1, beta2))


def get_lr(it):  # train.py
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--final-eval-iters", type=int, default=0,
                    help="after training, also estimate the validation loss over this many random batches")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_data, val_data, vs = load_data(args.data)
    assert vs == vocab_size, vs
    model = GPT()
    optimizer = make_optimizer(model)

    @torch.no_grad()
    def estimate_loss(iters=eval_iters):
        model.eval()
        out = {}
        for split, data in (("train", train_data), ("val", val_data)):
            out[split] = torch.stack([model(*get_batch(data)) for _ in range(iters)]).mean().item()
        model.train()
        return out

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS', '-')}, {sum(p.numel() for p in model.parameters())} parameters, "
          f"vocab {vocab_size}")
    t0 = time.time()
    t_eval = 0.0
    X, Y = get_batch(train_data)
    for it in range(args.iters + 1):
        for g in optimizer.param_groups:
            g["lr"] = get_lr(it)
        if it % eval_interval == 0:
            te = time.time()
            losses = estimate_loss()
            t_eval += time.time() - te
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, {time.time() - t0:.1f} s",
                  flush=True)
        if it == args.iters:
            break
        loss = model(X, Y)
        X, Y = get_batch(train_data)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    wall = time.time() - t0
    print(f"pytorch: {args.iters} iterations in {wall:.1f} s ({(wall - t_eval) / args.iters * 1e3:.2f} ms per training "
          f"iteration, evaluations {t_eval:.1f} s), final val loss {losses['val']:.4f}")
    if args.final_eval_iters:
        big = estimate_loss(args.final_eval_iters)
        print(f"final val loss over {args.final_eval_iters} batches: {big['val']:.4f} (train {big['train']:.4f})")


if __name__ == "__main__":
    main()
