"""PyTorch 2 training steps for Kiln's GPT sample (samples/shakespeare_char.toml) and ResNet sample
(samples/resnet_fashion_mnist.toml), for torch2_step.py's kinds gpt and resnet. The models, optimizers, schedules
and data encodings are imported from the accuracy scripts that train the same recipes in PyTorch
(bench/accuracy/torch_shakespeare_char.py, bench/accuracy/torch_resnet_fashion_mnist.py: importing them trains
nothing), so the timed step is the step whose accuracy was compared with Kiln's.

sample(kind, batch, amp, compile_mode) -> (step, draw): draw(g) gathers one batch of real data with the generator g
(as the existing kinds' loop does), step(x, y) trains on it and returns the loss tensor.
- gpt: nanoGPT's character model (4 layers, 4 heads, 128 wide, block 64, no dropout, no biases, tied lm_head),
  AdamW (lr 1e-3, betas 0.9/0.99, decay 0.1 on rank >= 2) with train.py's warmup + cosine lr set each step, global
  gradient-norm clipping at 1.0. draw: BATCH random 64-character windows of the first 90% of tiny Shakespeare and
  the windows one character on (one gather, where nanoGPT stacks BATCH slices).
- resnet: stem + three basic blocks (16/32/64, TensorFlow "same" padding at stride 2), Adam lr 2e-3 eps 1e-7 with
  CosineAnnealingLR over the sample's 10 epochs. draw: BATCH random training images, scaled and normalized once at
  load as the sample's cached map stage does, each flipped horizontally with probability 1/2 (the sample's training
  map stage after the cache).
amp "bf16": forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), as torch_epoch.make_step does.
compile_mode as torch_epoch.make_step: "model" compiles the model, "step" the whole step function.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../accuracy"))
import torch_resnet_fashion_mnist as resnet_ref  # noqa: E402
import torch_shakespeare_char as gpt_ref  # noqa: E402

KINDS = ("gpt", "resnet")


def _wrap(step, compile_mode):
    return torch.compile(step) if compile_mode == "step" else step


def gpt_sample(batch, amp=None, compile_mode=None):
    torch.manual_seed(1337)  # the sample's seed
    model = gpt_ref.GPT()
    opt = gpt_ref.make_optimizer(model)
    fwd = torch.compile(model) if compile_mode == "model" else model
    train, _, vocab = gpt_ref.load_data()
    assert vocab == gpt_ref.vocab_size, vocab
    data = torch.from_numpy(train.astype(np.int64))
    T = gpt_ref.block_size
    offsets = torch.arange(T)
    it = [0]

    def draw(g):
        ix = torch.randint(len(data) - T, (batch, 1), generator=g) + offsets
        return data[ix], data[ix + 1]

    def step(x, y):
        lr = gpt_ref.get_lr(it[0])
        it[0] += 1
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), gpt_ref.grad_clip)
        opt.step()
        return loss

    return _wrap(step, compile_mode), draw


def resnet_sample(batch, amp=None, compile_mode=None):
    torch.manual_seed(42)  # the sample's seed
    model = resnet_ref.make_model()
    model.train()
    fwd = torch.compile(model) if compile_mode == "model" else model
    X = torch.from_numpy(resnet_ref.images("train-images-idx3-ubyte.gz"))
    Y = torch.from_numpy(resnet_ref.labels("train-labels-idx1-ubyte.gz"))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, eps=1e-7)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10 * math.ceil(len(X) / batch))
    loss_fn = nn.CrossEntropyLoss()

    def draw(g):
        idx = torch.randint(0, X.shape[0], (batch,), generator=g)
        x = X[idx]
        flip = torch.rand(batch, generator=g) < 0.5
        x[flip] = x[flip].flip(-1)
        return x, Y[idx]

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
            loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss

    return _wrap(step, compile_mode), draw


def sample(kind, batch, amp=None, compile_mode=None):
    return (gpt_sample if kind == "gpt" else resnet_sample)(batch, amp, compile_mode)
