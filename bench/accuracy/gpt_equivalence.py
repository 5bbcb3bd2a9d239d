#!/usr/bin/python3
"""Kiln's samples/shakespeare_char.toml against nanoGPT's model in PyTorch, step for step.

  gpt_equivalence.py INIT_CHECKPOINT KILN_METRICS STEPS [STEPS_PER_EPOCH]

INIT_CHECKPOINT holds Kiln's initial weights (equivalence.sh writes it with a learning rate of 1e-30); they are
copied into nanoGPT's GPT (torch_shakespeare_char.py), which then trains STEPS steps on the batches Kiln's text source
gives with sampling = "sequential" (batch s: windows 12 s .. 12 s + 11 at offsets 64 k), with the same AdamW,
warmup, gradient clipping. With STEPS_PER_EPOCH, Kiln's sequential windows start again at window 0 every that many
steps (its epochs), and so do these. Prints each step's loss beside Kiln's (metrics.jsonl step records) and the worst relative
difference."""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_shakespeare_char as ref  # noqa: E402
from equivalence import load_checkpoint  # noqa: E402


def main():
    init, metrics, steps = load_checkpoint(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    per_epoch = int(sys.argv[4]) if len(sys.argv) > 4 else steps
    kiln = [json.loads(l) for l in open(metrics) if '"event":"step"' in l]
    kiln_loss = {r["step"]: r["loss"] for r in kiln}
    train_data, _, _ = ref.load_data()
    model = ref.GPT()
    T = ref.block_size
    with torch.no_grad():
        def put(p, a):
            assert tuple(p.shape) == a.shape, (p.shape, a.shape)
            p.copy_(torch.from_numpy(a))
        put(model.wte.weight, init["wte.table"])
        put(model.wpe.weight, init["wpe.table"])
        for i, blk in enumerate(model.h):
            put(blk.ln_1.weight, init[f"h{i}_ln_1.gamma"])
            put(blk.ln_2.weight, init[f"h{i}_ln_2.gamma"])
            put(blk.attn.c_attn.weight, init[f"h{i}_attn.qkv_kernel"].T.copy())
            put(blk.attn.c_proj.weight, init[f"h{i}_attn.proj_kernel"].T.copy())
            put(blk.mlp.c_fc.weight, init[f"h{i}_fc.kernel"].T.copy())
            put(blk.mlp.c_proj.weight, init[f"h{i}_proj.kernel"].T.copy())
        put(model.ln_f.weight, init["ln_f.gamma"])
    opt = ref.make_optimizer(model)
    worst = 0.0
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = ref.get_lr(s)
        offs = [(ref.batch_size * (s % per_epoch) + j) * T for j in range(ref.batch_size)]
        x = torch.stack([torch.from_numpy(train_data[o:o + T].astype(np.int64)) for o in offs])
        y = torch.stack([torch.from_numpy(train_data[o + 1:o + 1 + T].astype(np.int64)) for o in offs])
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ref.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        k = kiln_loss.get(s + 1)
        rel = abs(k - loss.item()) / abs(loss.item()) if k is not None else float("nan")
        worst = max(worst, rel) if k is not None else worst
        if s < 5 or (s + 1) % (10 if steps <= 300 else 100) == 0:
            print(f"step {s + 1:4d}: pytorch {loss.item():.6f}  kiln {k if k is None else f'{k:.6f}'}  relative {rel:.2e}")
    print(f"gpt: worst relative loss difference over {steps} steps: {worst:.3g}")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
