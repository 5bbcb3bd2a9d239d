#!/usr/bin/env python3
"""Writes the [model] of Kiln's GPT-2 (the layer names [init] preset = "gpt2" expects, docs/weights.md) as TOML.

  python3 bench/gpt2/gpt_config.py --layers 12 --heads 12 --width 768 --vocab 50257 --context 256 > model.toml

Layers: wte (embedding), wpe (positional_embedding), per block i: h{i}_ln_1, h{i}_attn, h{i}_res_1, h{i}_ln_2,
h{i}_fc (dense 4C, gelu tanh), h{i}_proj, h{i}_res_2; ln_f, lm_head (dense tied to wte). Hugging Face's
GPT2LMHeadModel: layer norm eps 1e-5, biases everywhere, gelu_new, learned positions, tied output.
"""
import argparse
import math


def model_toml(layers, heads, width, vocab, context, dropout=0.0):
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * layers)
    out = [
        "[model]",
        f"input_shape = [{context}]",
        'outputs = [{layer = "lm_head", loss = "softmax_cross_entropy"}]',
        "",
        f'[[model.layers]]\nname = "wte"\ntype = "embedding"\nvocab = {vocab}\ndim = {width}\ninit_std = {std}',
        f'[[model.layers]]\nname = "wpe"\ntype = "positional_embedding"\ninit_std = {std}',
    ]
    if dropout:
        out.append(f'[[model.layers]]\nname = "drop"\ntype = "dropout"\nrate = {dropout}')
    x = "drop" if dropout else "wpe"
    for i in range(layers):
        h = f"h{i}"
        out += [
            f'[[model.layers]]\nname = "{h}_ln_1"\ntype = "layer_norm"\nepsilon = 1e-5\ninputs = ["{x}"]',
            f'[[model.layers]]\nname = "{h}_attn"\ntype = "attention"\nheads = {heads}\ncausal = true\n'
            f"dropout = {dropout}\ninit_std = {std}\nproj_init_std = {proj_std!r}",
            f'[[model.layers]]\nname = "{h}_res_1"\ntype = "add"\ninputs = ["{x}", "{h}_attn"]',
            f'[[model.layers]]\nname = "{h}_ln_2"\ntype = "layer_norm"\nepsilon = 1e-5',
            f'[[model.layers]]\nname = "{h}_fc"\ntype = "dense"\nunits = {4 * width}\nactivation = "gelu_tanh"\n'
            f"init_std = {std}",
            f'[[model.layers]]\nname = "{h}_proj"\ntype = "dense"\nunits = {width}\ninit_std = {proj_std!r}',
        ]
        if dropout:
            out.append(f'[[model.layers]]\nname = "{h}_drop"\ntype = "dropout"\nrate = {dropout}')
        out.append(
            f'[[model.layers]]\nname = "{h}_res_2"\ntype = "add"\n'
            f'inputs = ["{h}_res_1", "{h + "_drop" if dropout else h + "_proj"}"]'
        )
        x = f"{h}_res_2"
    out += [
        f'[[model.layers]]\nname = "ln_f"\ntype = "layer_norm"\nepsilon = 1e-5\ninputs = ["{x}"]',
        '[[model.layers]]\nname = "lm_head"\ntype = "dense"\nuse_bias = false\ntie = "wte"',
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.0)
    a = ap.parse_args()
    print(model_toml(a.layers, a.heads, a.width, a.vocab, a.context, a.dropout), end="")
