#!/usr/bin/env python3
"""Kiln's GPT-2 small (samples/gpt2_small.toml, [init] preset = "gpt2") against Hugging Face's GPT2LMHeadModel at
full shape (124M parameters, vocab 50257): the same weights, the same batches. Results: bench/results/gpt2.md.

  P=.venv-export/bin/python   # torch + transformers (setup.sh installs transformers 4.40.2 there)
  $P bench/gpt2/compare.py prepare /tmp/gpt2     # a random GPT2LMHeadModel (seed 0) saved with save_pretrained,
                                                 # tokens.bin: uint16 ids of a repeated noisy sequence (learnable)
  $P bench/gpt2/compare.py logits /tmp/gpt2      # kiln predict's probabilities vs transformers' log-softmax
  $P bench/gpt2/compare.py finetune /tmp/gpt2 --steps 200 --batch 4 --context 256
                                                 # AdamW, dropout off: Kiln's loss per step vs a PyTorch loop
  $P bench/gpt2/compare.py float64 /tmp/gpt2 --steps 200 ...    # the PyTorch loop in float64, against both
  MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864 .venv-peers/bin/python bench/gpt2/compare.py \\
      speed /tmp/gpt2 --steps 4 --threads 1,2    # training-step tokens/s, Kiln vs PyTorch's best thread setting

Kiln runs as `kiln train samples/gpt2_small.toml --set ...` (the sample, with the paths and the schedule set on
the command line), so what is measured is the sample's model.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAMPLE = os.path.join(ROOT, "samples", "gpt2_small.toml")
VOCAB = 50257


def kiln_train(a, out, steps, batch, context, optimizer, extra=()):
    """kiln train of the sample from DIR/model.safetensors on DIR/tokens.bin, sequential windows (0, T, 2T, ...)."""
    stages = (f'[{{type="tokens", path="{a.dir}/tokens.bin", vocab_size={VOCAB}, block_size={context}, '
              f'sampling="sequential"}}]')
    sets = [f"init.from={a.dir}/model.safetensors", f"model.input_shape=[{context}]", f"data.train.stages={stages}",
            f"data.test.stages={stages}", "train.evaluate=false", f"train.batch_size={batch}",
            f"train.steps_per_epoch={steps}", "train.checkpoint_every_steps=0", f"train.output_dir={out}",
            "log.every_steps=1"] + [f"optimizer.{k}={v}" for k, v in optimizer.items()] + list(extra)
    cmd = [a.kiln, "train", SAMPLE, "--overwrite"] + [x for s in sets for x in ("--set", s)]
    print("$", " ".join(cmd[:3]), "...", flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stdout + r.stderr)
    print("\n".join(line for line in r.stdout.splitlines() if line.startswith("initialized")), flush=True)
    recs = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [x for x in recs if x["event"] == "step"], time.time() - t0


def windows(tokens, step, batch, context):
    """The batch Kiln's sequential tokens source gives at `step` (0-based): examples k = step*batch .. at k*T."""
    x = np.stack([tokens[k * context:(k + 1) * context] for k in range(step * batch, (step + 1) * batch)])
    y = np.stack([tokens[k * context + 1:(k + 1) * context + 1] for k in range(step * batch, (step + 1) * batch)])
    return x.astype(np.int64), y.astype(np.int64)


def hf_model(a):
    from transformers import GPT2LMHeadModel
    return GPT2LMHeadModel.from_pretrained(a.dir)


def cmd_prepare(a):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    m.save_pretrained(a.dir, safe_serialization=True)
    rng = np.random.default_rng(1)
    base = rng.integers(0, VOCAB, 997)
    parts = [np.where(rng.random(997) < 0.1, rng.integers(0, VOCAB, 997), base) for _ in range(220)]
    np.concatenate(parts).astype("<u2").tofile(os.path.join(a.dir, "tokens.bin"))
    print(f"{sum(p.numel() for p in m.parameters())} parameters, tokens.bin in {a.dir}")


def cmd_logits(a):
    import torch
    tokens = np.fromfile(os.path.join(a.dir, "tokens.bin"), dtype="<u2")
    x, _ = windows(tokens, 0, a.batch, a.context)
    np.save(os.path.join(a.dir, "ids.npy"), x.astype(np.float32))
    out = os.path.join(a.dir, "run_logits")
    # One AdamW step at a learning rate far below float32's resolution of the weights: the checkpoint holds the
    # loaded weights (kiln predict reads a checkpoint).
    kiln_train(a, out, 1, a.batch, a.context, {"learning_rate": "1e-30"})
    probs_path = os.path.join(a.dir, "probs.npy")
    stages = f'[{{type="tokens", path="{a.dir}/tokens.bin", vocab_size={VOCAB}, block_size={a.context}}}]'
    sets = [f"init.from={a.dir}/model.safetensors", f"model.input_shape=[{a.context}]", f"data.train.stages={stages}",
            f"data.test.stages={stages}", f"train.batch_size={a.batch}"]
    subprocess.run([a.kiln, "predict", SAMPLE, "--overwrite", "--checkpoint", os.path.join(out, "checkpoint.kiln"),
                    "--input", os.path.join(a.dir, "ids.npy"), "--output", probs_path] +
                   [x for s in sets for x in ("--set", s)], check=True)
    p = np.load(probs_path).reshape(a.batch, a.context, VOCAB).astype(np.float64)
    m = hf_model(a).double().eval()
    with torch.no_grad():
        logits = m(torch.from_numpy(x)).logits
    logq = torch.log_softmax(logits, -1).numpy()
    d_logp = np.abs(np.log(p) - logq).max()
    d_p = np.abs(p - np.exp(logq)).max()
    print(f"GPT-2 small, batch {a.batch} x context {a.context}: max |log p_kiln - log p_hf| = {d_logp:.3g}, "
          f"max |p_kiln - p_hf| = {d_p:.3g} (transformers in float64; |logits| up to {logits.abs().max():.3g})")


def adamw_groups(m, wd):
    decay = [p for p in m.parameters() if p.dim() >= 2]
    no = [p for p in m.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}]


def cmd_finetune(a):
    import torch
    import torch.nn.functional as F
    opt = {"learning_rate": a.lr, "beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8, "weight_decay": 0.1,
           "clip_norm": 1.0}
    kiln_steps, kiln_s = kiln_train(a, os.path.join(a.dir, "run_finetune"), a.steps, a.batch, a.context, opt)
    kl = [r["loss"] for r in kiln_steps]
    tokens = np.fromfile(os.path.join(a.dir, "tokens.bin"), dtype="<u2")
    m = hf_model(a).train()  # dropout probabilities are 0 in the saved config
    o = torch.optim.AdamW(adamw_groups(m, 0.1), lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    tl = []
    t0 = time.time()
    for step in range(a.steps):
        x, y = windows(tokens, step, a.batch, a.context)
        logits = m(torch.from_numpy(x)).logits
        loss = F.cross_entropy(logits.view(-1, VOCAB), torch.from_numpy(y).view(-1))
        o.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        o.step()
        tl.append(loss.item())
        print(f"step {step + 1}: kiln {kl[step]:.6f}  torch {tl[-1]:.6f}  rel {abs(kl[step] - tl[-1]) / tl[-1]:.2e}",
              flush=True)
    json.dump({"kiln": kl, "torch": tl}, open(os.path.join(a.dir, f"finetune_lr{a.lr:g}.json"), "w"))
    rel = [abs(k - t) / t for k, t in zip(kl, tl)]
    print(f"{a.steps} AdamW steps (lr {a.lr}, batch {a.batch}, context {a.context}): loss {tl[0]:.4f} -> {tl[-1]:.4f} "
          f"(torch), {kl[0]:.4f} -> {kl[-1]:.4f} (kiln); max relative difference {max(rel):.3g} at step "
          f"{rel.index(max(rel)) + 1}; Kiln {kiln_s:.0f} s, torch {time.time() - t0:.0f} s")


def torch_losses(a, dtype):
    import torch
    import torch.nn.functional as F
    tokens = np.fromfile(os.path.join(a.dir, "tokens.bin"), dtype="<u2")
    m = hf_model(a).to(dtype).train()
    o = torch.optim.AdamW(adamw_groups(m, 0.1), lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    out = []
    for step in range(a.steps):
        x, y = windows(tokens, step, a.batch, a.context)
        loss = F.cross_entropy(m(torch.from_numpy(x)).logits.view(-1, VOCAB), torch.from_numpy(y).view(-1))
        o.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        o.step()
        out.append(loss.item())
    return out


def cmd_float64(a):
    """The PyTorch loop in float64: how far each float32 run (Kiln's, PyTorch's) is from the float64 trajectory."""
    import torch
    ref = torch_losses(a, torch.float64)
    runs = json.load(open(os.path.join(a.dir, f"finetune_lr{a.lr:g}.json")))
    for name, losses in runs.items():
        rel = [abs(x - r) / r for x, r in zip(losses, ref)]
        first = next((i + 1 for i, x in enumerate(rel) if x > 1e-3), None)
        print(f"{name} float32 vs torch float64: max relative difference {max(rel[:50]):.3g} over steps 1-50, "
              f"first above 1e-3 at step {first}, max {max(rel):.3g} at step {rel.index(max(rel)) + 1}, "
              f"final loss {losses[-1]:.4f} (float64 {ref[-1]:.4f})")


def cmd_speed(a):
    import torch
    import torch.nn.functional as F
    opt = {"learning_rate": 3e-5}
    steps, _ = kiln_train(a, os.path.join(a.dir, "run_speed"), a.steps, a.batch, a.context, opt)
    ks = [a.batch / r["examples_per_s"] for r in steps[1:]]  # seconds per step, the first (warm-up) left out
    print(f"kiln: {np.median(ks):.2f} s/step, {a.batch * a.context / np.median(ks):.0f} tokens/s "
          f"(median of steps 2..{a.steps})", flush=True)
    tokens = np.fromfile(os.path.join(a.dir, "tokens.bin"), dtype="<u2")
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        m = hf_model(a).train()
        o = torch.optim.AdamW(adamw_groups(m, 0.1), lr=3e-5)
        times = []
        for step in range(a.steps):
            x, y = windows(tokens, step, a.batch, a.context)
            t0 = time.perf_counter()
            logits = m(torch.from_numpy(x)).logits
            loss = F.cross_entropy(logits.view(-1, VOCAB), torch.from_numpy(y).view(-1))
            o.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
            times.append(time.perf_counter() - t0)
        s = float(np.median(times[1:]))
        print(f"torch {torch.__version__}, {threads} thread(s): {s:.2f} s/step, {a.batch * a.context / s:.0f} tokens/s",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["prepare", "logits", "finetune", "float64", "speed"])
    ap.add_argument("dir")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "bin", "kiln"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", default="1,2")
    a = ap.parse_args()
    a.dir = os.path.abspath(a.dir)
    os.makedirs(a.dir, exist_ok=True)
    {"prepare": cmd_prepare, "logits": cmd_logits, "finetune": cmd_finetune, "float64": cmd_float64,
     "speed": cmd_speed}[a.what](a)


if __name__ == "__main__":
    main()
