#!/usr/bin/env python3
"""Checks `kiln export` against `kiln predict` with other tools .

  check_export.py --kiln build/bin/kiln --config samples/fashion_mnist_mlp.toml --workdir /tmp/x [--checkpoint F]
  check_export.py ... --config samples/shakespeare_char.toml --inputs ids   (models whose input is token ids)

1. Writes the model's inputs to inputs.npy and runs `kiln predict --input inputs.npy --output preds.npy`: the first
   --examples Fashion-MNIST test images scaled to [0, 1] as the samples' [data.test] does ((N, 1, 28, 28) float32),
   or with --inputs ids random token ids below the first embedding's vocab ((N, input_shape) float32, seed 0).
2. `kiln export --format safetensors`: loads the file with the `safetensors` package (safetensors.torch) into the
   equivalent PyTorch model, built from the config's layers (dense, conv2d, max/avg pooling, global_avg_pool2d,
   flatten, activations, dropout (identity), batch_norm (evaluation: running statistics), add, concat, embedding,
   positional_embedding, layer_norm, attention) and run in float64, and compares its outputs (softmax probabilities
   for a softmax_cross_entropy head) with kiln predict's.
3. `kiln export --format onnx`: onnx.checker.check_model, then ONNX Runtime's outputs against kiln predict's.

Exit 0 when both agree to --tol (1e-5), 1 when not, 4 (skipped) when torch, safetensors, onnx, onnxruntime or numpy
is missing (Debian's python3-torch plus `pip install safetensors onnx onnxruntime` in a venv made with
--system-site-packages). Pass --weights raw|ema to choose the weights (default: as kiln evaluates).
"""
import argparse
import gzip
import math
import re
import os
import subprocess
import sys

SKIP = 4
try:
    import tomllib
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    import onnx
    import onnxruntime as ort
except ImportError as e:  # the ctest wrapper reports this as skipped, never passed
    print(f"KILN-SKIPPED: {e} (torch from python3-torch; pip install safetensors onnx onnxruntime)")
    sys.exit(SKIP)

# Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
FM = os.path.join(os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"),
                  "t10k-images-idx3-ubyte.gz")


def kiln(args, *rest):
    cmd = [args.kiln, *rest, args.config] + (["--checkpoint", args.checkpoint] if args.checkpoint else [])
    cmd += ["--weights", args.weights] + sum((["--set", s] for s in args.set), [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    print(r.stdout.strip())


def pairs(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def geometry(size, k, stride, same):
    if same:
        out = -(-size // stride)
        total = max((out - 1) * stride + k - size, 0)
        return out, total // 2, total - total // 2
    return (size - k) // stride + 1, 0, 0


def pad_same(x, kh, kw, sh, sw, same, fill):
    """TensorFlow's 'same' padding (the extra row/column at the end), as Kiln pads."""
    _, pt, pb = geometry(x.shape[2], kh, sh, same)
    _, pl, pr = geometry(x.shape[3], kw, sw, same)
    return F.pad(x, (pl, pr, pt, pb), value=fill)


def act(x, name):
    fns = {None: lambda v: v, "linear": lambda v: v, "relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
           "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
           "softmax": lambda v: torch.softmax(v, -1)}
    if name not in fns:
        raise SystemExit(f"check_export.py: activation {name} not in the PyTorch reference")
    return fns[name](x)


def expand_layers(tables):
    """[[model.layers]] with repeated blocks written out, as Kiln's parse_model expands them: each repetition i of a
    table with `repeat` adds its `block` tables with {i}, {i+K}, {i-K} and {prev} replaced in every string."""
    out = []

    def sub(v, i, prev):
        if isinstance(v, str):
            v = re.sub(r"\{i([+-]\d+)?\}", lambda m: str(i + int(m.group(1) or 0)), v)
            return v.replace("{prev}", prev)
        if isinstance(v, list):
            return [sub(e, i, prev) for e in v]
        if isinstance(v, dict):
            return {k: sub(e, i, prev) for k, e in v.items()}
        return v

    counts = {}
    for t in tables:
        prev = out[-1]["name"] if out else "input"
        if "repeat" not in t:
            t = dict(t)
            if "name" not in t:  # Kiln's default name, counted over the expanded layers
                counts[t["type"]] = counts.get(t["type"], 0) + 1
                t["name"] = f"{t['type']}_{counts[t['type']]}"
            out.append(t)
            continue
        prev = t.get("inputs", [prev])[0]
        for i in range(t["repeat"]):
            rep_input = prev
            for j, b in enumerate(t["block"]):
                layer = sub(b, i, rep_input)
                layer.setdefault("inputs", [prev])
                for k in ("trainable", "learning_rate_scale"):
                    if k in t:
                        layer.setdefault(k, t[k])
                if "name" not in layer:
                    counts[layer["type"]] = counts.get(layer["type"], 0) + 1
                    layer["name"] = f"{layer['type']}_{counts[layer['type']]}"
                out.append(layer)
                prev = layer["name"]
    return out


def torch_forward(cfg, w, x):
    """The config's layers as PyTorch computes them, in float64, with the exported tensors under Kiln's names
    (<name> or <type>_<k>). Returns the first output's values as kiln predict writes them."""
    w = {k: v.to(torch.float64) for k, v in w.items()}
    model = cfg["model"]
    counts, vals, prev = {}, {"input": x}, "input"
    for layer in expand_layers(model["layers"]):
        t = layer["type"]
        counts[t] = counts.get(t, 0) + 1
        name = layer.get("name", f"{t}_{counts[t]}")
        ins = [vals[i] for i in layer.get("inputs", [prev])]
        x = ins[0]
        p = lambda k: w[f"{name}.{k}"]  # noqa: E731
        if t == "flatten":
            y = x.reshape(x.shape[0], -1)
        elif t == "dense":
            if "tie" in layer:  # weight tying: the embedding's table (vocab, dim), transposed
                y = x @ w[layer["tie"] + ".table"].T
            else:
                y = x @ p("kernel")  # Kiln's kernel is (in, out): PyTorch's Linear.weight transposed
            if layer.get("use_bias", True):
                y = y + p("bias")
            y = act(y, layer.get("activation"))
        elif t == "conv2d":
            kr, ks = pairs(layer.get("kernel", 3))
            sh, sw = pairs(layer.get("strides", 1))
            xp = pad_same(x, kr, ks, sh, sw, layer.get("padding", "valid") == "same", 0.0)
            y = F.conv2d(xp, p("kernel"), p("bias") if layer.get("use_bias", True) else None, stride=(sh, sw))
            y = act(y, layer.get("activation"))
        elif t in ("max_pool2d", "avg_pool2d"):
            ph, pw = pairs(layer.get("pool", 2))
            sh, sw = pairs(layer.get("strides", [ph, pw]))
            same = layer.get("padding", "valid") == "same"
            if t == "max_pool2d":
                y = F.max_pool2d(pad_same(x, ph, pw, sh, sw, same, -math.inf), (ph, pw), (sh, sw))
            else:  # the mean of the valid elements of each window
                s = F.avg_pool2d(pad_same(x, ph, pw, sh, sw, same, 0.0), (ph, pw), (sh, sw), divisor_override=1)
                c = F.avg_pool2d(pad_same(torch.ones_like(x), ph, pw, sh, sw, same, 0.0), (ph, pw), (sh, sw), divisor_override=1)
                y = s / c
        elif t == "global_avg_pool2d":
            y = x.mean(dim=(2, 3))
        elif t == "dropout":
            y = x
        elif t == "activation":
            y = act(x, layer.get("function", "relu"))
        elif t == "batch_norm":  # evaluation: PyTorch's BatchNorm2d in eval() mode
            affine = layer.get("affine", True)
            y = F.batch_norm(x, p("running_mean"), p("running_var"), p("gamma") if affine else None,
                             p("beta") if affine else None, training=False, eps=layer.get("epsilon", 1e-5))
        elif t == "add":
            y = sum(ins[1:], ins[0])
        elif t == "concat":
            y = torch.cat(ins, dim=layer.get("axis", 1))
        elif t == "embedding":
            y = F.embedding(x.long(), p("table"))
        elif t == "positional_embedding":
            y = x + p("table")
        elif t == "layer_norm":
            c = x.shape[-1]
            y = F.layer_norm(x, (c,), p("gamma"), p("beta") if layer.get("use_bias", True) else None,
                             eps=layer.get("epsilon", 1e-5))
        elif t == "attention":  # nanoGPT's CausalSelfAttention with Kiln's (in, out) kernels
            B, T, C = x.shape
            H = layer["heads"]
            bias = layer.get("use_bias", True)
            qkv = x @ p("qkv_kernel") + (p("qkv_bias") if bias else 0)
            q, k, v = qkv.view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
            if layer.get("causal", True):
                att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -math.inf)
            y = (torch.softmax(att, -1) @ v).transpose(1, 2).reshape(B, T, C)
            y = y @ p("proj_kernel") + (p("proj_bias") if bias else 0)
        else:
            raise SystemExit(f"check_export.py: layer type {t} not in the PyTorch reference")
        vals[name] = y
        prev = name
    outs = model.get("outputs")
    head = outs[0] if outs else {"layer": prev, "loss": model.get("loss")}
    y = vals[head["layer"]]
    if head.get("loss") == "softmax_cross_entropy":
        y = torch.softmax(y, -1)
    elif head.get("loss") == "binary_cross_entropy" and head.get("from_logits", True):
        y = torch.sigmoid(y)
    return y.reshape(y.shape[0], -1).numpy()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint")
    p.add_argument("--workdir", required=True)
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--weights", default="auto", choices=["auto", "raw", "ema"])
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--inputs", default="fashion_mnist", choices=["fashion_mnist", "ids"])
    p.add_argument("--set", action="append", default=[], help="passed to every kiln command as --set")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)

    if args.inputs == "ids":
        vocab = next(l["vocab"] for l in cfg["model"]["layers"] if l["type"] == "embedding")
        shape = [args.examples] + list(cfg["model"]["input_shape"])
        x = np.random.default_rng(0).integers(0, vocab, shape).astype(np.float32)
    else:
        with gzip.open(FM) as f:
            raw = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[: args.examples]
        x = (raw.astype(np.float32) * np.float32(0.00392156862745098)).astype(np.float32)  # the samples' scale stage
    d = args.workdir
    np.save(f"{d}/inputs.npy", x)
    for f in ("preds.npy", "model.safetensors", "model.onnx"):
        if os.path.exists(f"{d}/{f}"):
            os.remove(f"{d}/{f}")
    kiln(args, "predict", "--input", f"{d}/inputs.npy", "--output", f"{d}/preds.npy")
    preds = np.load(f"{d}/preds.npy")
    assert preds.shape[0] == len(x), preds.shape

    kiln(args, "export", "--format", "safetensors", "--output", f"{d}/model.safetensors")
    w = load_file(f"{d}/model.safetensors")
    with torch.no_grad():
        ref = torch_forward(cfg, w, torch.from_numpy(x).to(torch.float64))
    st = float(np.abs(ref - preds).max())
    print(f"safetensors in PyTorch {torch.__version__} (float64) vs kiln predict: max |diff| = {st:.3g} over {preds.size} outputs")

    kiln(args, "export", "--format", "onnx", "--output", f"{d}/model.onnx")
    m = onnx.load(f"{d}/model.onnx")
    onnx.checker.check_model(m, full_check=True)
    sess = ort.InferenceSession(f"{d}/model.onnx", providers=["CPUExecutionProvider"])
    out = sess.run(None, {"input": x})[0]
    out = out.reshape(out.shape[0], -1)
    ox = float(np.abs(out - preds).max())
    print(f"onnx.checker: ok (opset {m.opset_import[0].version}, {len(m.graph.node)} nodes); "
          f"onnxruntime {ort.__version__} vs kiln predict: max |diff| = {ox:.3g}")
    agree = float((out.argmax(1) == preds.argmax(1)).mean())  # (per example; per position for sequences)
    print(f"argmax agreement onnxruntime / kiln: {agree:.4f}")
    ok = st <= args.tol and ox <= args.tol
    print("OK" if ok else f"FAILED: tolerance {args.tol}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
