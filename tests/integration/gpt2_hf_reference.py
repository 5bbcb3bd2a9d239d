#!/usr/bin/env python3
"""A small, randomly initialized Hugging Face GPT2LMHeadModel, saved as save_pretrained writes it (safetensors), with
its logits on a batch of token ids: the reference tests/integration/test_init_from.cpp loads into Kiln's GPT with
[init] preset = "gpt2". Offline: the model is built from a GPT2Config, nothing is downloaded.

  gpt2_hf_reference.py OUT_DIR [--layers 2 --heads 2 --width 64 --vocab 100 --positions 32 --batch 3 --context 16]

Writes OUT_DIR/model.safetensors (+ config.json), OUT_DIR/ids.npy (batch, context) float32 token ids and
OUT_DIR/logits.npy (batch, context, vocab) float32, computed in float64, dropout off.
"""
import argparse
import os

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=100)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.width, vocab_size=a.vocab, n_positions=a.positions,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).eval()
    # Every tensor away from its default (norm scales 1, biases 0), so a scale loaded as a bias, or q and k swapped,
    # changes the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    ids = torch.randint(0, a.vocab, (a.batch, a.context))
    with torch.no_grad():
        logits = model.double()(ids).logits
    np.save(os.path.join(a.out, "ids.npy"), ids.numpy().astype(np.float32))
    np.save(os.path.join(a.out, "logits.npy"), logits.numpy().astype(np.float32))


if __name__ == "__main__":
    main()
