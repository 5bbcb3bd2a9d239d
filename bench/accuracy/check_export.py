#!/usr/bin/env python3
"""Checks `kiln export` against `kiln predict` with other tools (issue 13).

  check_export.py --kiln build/bin/kiln --config samples/fashion_mnist_mlp.toml --workdir /tmp/x [--checkpoint F]

1. Writes the first --examples Fashion-MNIST test images, scaled to [0, 1] as the samples' [data.test] does, to
   inputs.npy (N, 1, 28, 28) float32, and runs `kiln predict --input inputs.npy --output preds.npy`.
2. `kiln export --format safetensors`: loads the file with the `safetensors` package (safetensors.numpy), runs the
   config's layers in a NumPy reimplementation (dense, conv2d, max/avg pooling, flatten, relu/sigmoid/tanh, dropout as
   identity) and compares the softmax probabilities with kiln predict's.
3. `kiln export --format onnx`: onnx.checker.check_model, then ONNX Runtime's outputs against kiln predict's.

Exit 0 when both agree to --tol (1e-5), 1 when not, 4 (skipped) when safetensors, onnx, onnxruntime or numpy is
missing. Pass --weights raw|ema to choose the weights (default: as kiln evaluates).
"""
import argparse
import gzip
import os
import subprocess
import sys

SKIP = 4
try:
    import tomllib
    import numpy as np
    from safetensors.numpy import load_file
    import onnx
    import onnxruntime as ort
except ImportError as e:  # the ctest wrapper reports this as skipped, never passed
    print(f"KILN-SKIPPED: {e} (pip install safetensors onnx onnxruntime numpy)")
    sys.exit(SKIP)

FM = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def kiln(args, *rest):
    cmd = [args.kiln, *rest, args.config] + (["--checkpoint", args.checkpoint] if args.checkpoint else [])
    cmd += ["--weights", args.weights]
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


def windows(x, kh, kw, sh, sw, same, fill):
    """x (N, C, H, W) -> (N, C, OH, OW, kh, kw) windows, padded with `fill` (TensorFlow's 'same': extra at the end)."""
    n, c, h, w = x.shape
    oh, pt, pb = geometry(h, kh, sh, same)
    ow, pl, pr = geometry(w, kw, sw, same)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    s = xp.strides
    v = np.lib.stride_tricks.as_strided(xp, (n, c, oh, ow, kh, kw), (s[0], s[1], s[2] * sh, s[3] * sw, s[2], s[3]))
    return v


def act(x, name):
    if name in (None, "linear"):
        return x
    if name == "relu":
        return np.maximum(x, 0)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    raise SystemExit(f"check_export.py: activation {name} not in the NumPy reference")


def numpy_forward(cfg, w, x):
    """The config's sequential layers in float64, named as Kiln names parameters (<type>_<k>)."""
    counts = {}
    x = x.astype(np.float64)
    for layer in cfg["model"]["layers"]:
        t = layer["type"]
        counts[t] = counts.get(t, 0) + 1
        name = layer.get("name", f"{t}_{counts[t]}")
        if t == "flatten":
            x = x.reshape(x.shape[0], -1)
        elif t == "dense":
            x = x @ w[name + ".kernel"].astype(np.float64)  # Kiln's kernel is (in, out)
            if layer.get("use_bias", True):
                x = x + w[name + ".bias"]
            x = act(x, layer.get("activation"))
        elif t == "conv2d":
            kr, ks = pairs(layer.get("kernel", 3))
            sh, sw = pairs(layer.get("strides", 1))
            win = windows(x, kr, ks, sh, sw, layer.get("padding", "valid") == "same", 0.0)
            x = np.einsum("ncpqrs,kcrs->nkpq", win, w[name + ".kernel"].astype(np.float64))  # kernel (out, in, kh, kw)
            if layer.get("use_bias", True):
                x = x + w[name + ".bias"][None, :, None, None]
            x = act(x, layer.get("activation"))
        elif t in ("max_pool2d", "avg_pool2d"):
            ph, pw = pairs(layer.get("pool", 2))
            sh, sw = pairs(layer.get("strides", [ph, pw]))
            same = layer.get("padding", "valid") == "same"
            if t == "max_pool2d":
                x = windows(x, ph, pw, sh, sw, same, -np.inf).max(axis=(4, 5))
            else:
                ones = np.ones_like(x)
                x = windows(x, ph, pw, sh, sw, same, 0.0).sum(axis=(4, 5)) / windows(ones, ph, pw, sh, sw, same, 0.0).sum(axis=(4, 5))
        elif t == "dropout":
            pass
        elif t == "activation":
            x = act(x, layer.get("function", "relu"))
        else:
            raise SystemExit(f"check_export.py: layer type {t} not in the NumPy reference")
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint")
    p.add_argument("--workdir", required=True)
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--weights", default="auto", choices=["auto", "raw", "ema"])
    p.add_argument("--tol", type=float, default=1e-5)
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)

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
    ref = numpy_forward(cfg, w, x)
    st = float(np.abs(ref - preds).max())
    print(f"safetensors + NumPy reference vs kiln predict: max |diff| = {st:.3g} over {preds.size} probabilities")

    kiln(args, "export", "--format", "onnx", "--output", f"{d}/model.onnx")
    m = onnx.load(f"{d}/model.onnx")
    onnx.checker.check_model(m, full_check=True)
    sess = ort.InferenceSession(f"{d}/model.onnx", providers=["CPUExecutionProvider"])
    out = sess.run(None, {"input": x})[0]
    ox = float(np.abs(out - preds).max())
    print(f"onnx.checker: ok (opset {m.opset_import[0].version}, {len(m.graph.node)} nodes); "
          f"onnxruntime {ort.__version__} vs kiln predict: max |diff| = {ox:.3g}")
    agree = float((out.argmax(1) == preds.argmax(1)).mean())
    print(f"argmax agreement onnxruntime / kiln: {agree:.4f}")
    ok = st <= args.tol and ox <= args.tol
    print("OK" if ok else f"FAILED: tolerance {args.tol}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
