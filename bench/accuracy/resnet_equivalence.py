#!/usr/bin/python3
"""Kiln's samples/resnet_fashion_mnist.toml against the same ResNet in PyTorch, step for step.

  resnet_equivalence.py INIT_CHECKPOINT KILN_METRICS KILN_CHECKPOINT STEPS

INIT_CHECKPOINT holds Kiln's initial weights (equivalence.sh writes it with a learning rate of 1e-30; its batch-norm
running statistics have seen one batch, so they are not copied: both sides start from mean 0, variance 1). They are
copied into torch_resnet_fashion_mnist.py's model, which then trains STEPS steps in training mode on the batches Kiln
gives without shuffle or flip (batch s: training images 128 s .. 128 s + 127), with Adam (epsilon 1e-7) and Kiln's
cosine decay over STEPS steps. Prints each step's loss beside Kiln's (metrics.jsonl step records), the worst relative
difference, and after STEPS steps the relative difference of every weight and running statistic."""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_resnet_fashion_mnist as ref  # noqa: E402
from equivalence import load_checkpoint  # noqa: E402


def pairs(model):
    """(Kiln layer name, conv module, batch-norm module) of the model, in order."""
    out = [("stem", model[0], "stem_bn", model[1])]
    for s, blk in zip((1, 2, 3), (model[3], model[4], model[5])):
        c1 = blk.c1[1] if isinstance(blk.c1, torch.nn.Sequential) else blk.c1
        out.append((f"s{s}_conv1", c1, f"s{s}_bn1", blk.b1))
        out.append((f"s{s}_conv2", blk.c2, f"s{s}_bn2", blk.b2))
        if blk.proj is not None:
            out.append((f"s{s}_proj", blk.proj[0], f"s{s}_proj_bn", blk.proj[1]))
    return out


def main():
    init, metrics, final, steps = (load_checkpoint(sys.argv[1]), sys.argv[2], load_checkpoint(sys.argv[3]),
                                   int(sys.argv[4]))
    kiln_loss = {r["step"]: r["loss"] for r in map(json.loads, open(metrics)) if r.get("event") == "step"}
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
    x = torch.from_numpy(ref.images("train-images-idx3-ubyte.gz")[:128 * steps])
    y = torch.from_numpy(ref.labels("train-labels-idx1-ubyte.gz")[:128 * steps])
    model = ref.make_model()
    lin = model[8]
    with torch.no_grad():
        def put(p, a):
            assert tuple(p.shape) == a.shape, (p.shape, a.shape)
            p.copy_(torch.from_numpy(a))
        for cn, conv, bn, norm in pairs(model):
            put(conv.weight, init[cn + ".kernel"])
            put(norm.weight, init[bn + ".gamma"])
            put(norm.bias, init[bn + ".beta"])
        put(lin.weight, init["logits.kernel"].T.copy())
        put(lin.bias, init["logits.bias"])
    lr0 = 2e-3
    opt = torch.optim.Adam(model.parameters(), lr=lr0, eps=1e-7)
    model.train()
    worst = 0.0
    for s in range(steps):
        for g in opt.param_groups:  # Kiln's cosine: 0.5 lr (1 + cos(pi s / STEPS)), floor 0
            g["lr"] = lr0 * 0.5 * (1 + math.cos(math.pi * s / steps))
        loss = torch.nn.functional.cross_entropy(model(x[128 * s:128 * s + 128]), y[128 * s:128 * s + 128])
        opt.zero_grad()
        loss.backward()
        opt.step()
        k = kiln_loss.get(s + 1)
        rel = abs(k - loss.item()) / abs(loss.item()) if k is not None else float("nan")
        worst = max(worst, rel) if k is not None else worst
        if s < 5 or (s + 1) % 10 == 0:
            print(f"step {s + 1:4d}: pytorch {loss.item():.6f}  kiln {k if k is None else f'{k:.6f}'}  relative {rel:.2e}")
    missing = [s for s in range(1, steps + 1) if s not in kiln_loss]
    if missing:
        print(f"resnet: Kiln's metrics have no loss for {len(missing)} step(s), first {missing[0]}")
        return 1
    print(f"resnet: worst relative loss difference over {steps} steps: {worst:.3g}")
    wworst = 0.0
    with torch.no_grad():
        tensors = []
        for cn, conv, bn, norm in pairs(model):
            tensors += [(cn + ".kernel", conv.weight), (bn + ".gamma", norm.weight), (bn + ".beta", norm.bias),
                        (bn + ".running_mean", norm.running_mean), (bn + ".running_var", norm.running_var)]
        tensors += [("logits.kernel", lin.weight.T), ("logits.bias", lin.bias)]
        for name, t in tensors:
            a, b = t.numpy(), final[name]
            rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))
            wworst = max(wworst, rel)
        print(f"resnet: after {steps} steps, worst relative difference of a weight or running statistic "
              f"(Frobenius norm): {wworst:.3g}")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
