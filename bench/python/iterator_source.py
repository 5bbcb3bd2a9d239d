"""The MLP sample (batch 32) fed by its built-in idx pipeline and by a Python generator of shuffled NumPy batches
(kiln.data.generator), alternating, from kiln.Run.fit: each epoch's seconds and input-bound share.

    PYTHONPATH=build/python python3 bench/python/iterator_source.py [ROUNDS] [WORK_DIR]

The generator decodes Fashion-MNIST once with NumPy and yields (x[j], y[j]) for a fresh permutation each epoch, as a
user's own data code would; Kiln's pipeline is the sample's (idx decoded once, scale, full shuffle, batch).
"""
import gzip
import os
import re
import sys
import numpy as np
import kiln

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAMPLE = os.path.join(ROOT, "samples", "fashion_mnist_mlp.toml")
W = sys.argv[2] if len(sys.argv) > 2 else "/tmp/kiln_iterator_source"
os.makedirs(W, exist_ok=True)
D = "/usr/share/datasets/fashion-mnist/"
def load(img, lab):
    x = np.frombuffer(gzip.open(D + img).read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    y = np.frombuffer(gzip.open(D + lab).read(), np.uint8, offset=8)
    return x, y
x8, y8 = load("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
x = (x8.astype(np.float32) / 255.0)
y = y8.astype(np.float32)

def batches(epoch):
    order = np.random.default_rng(1000 + epoch).permutation(len(x))
    for i in range(0, len(x), 32):
        j = order[i:i + 32]
        yield x[j], y[j]

text = open(SAMPLE).read()
gen_text = re.sub(r"\[data\.train\]\nstages = \[.*?\n\]", '[data.train]\nstages = [ { type = "generator", id = "g" }, { type = "batch" } ]', text, flags=re.S)
open(f"{W}/gen.toml", "w").write(gen_text.replace('name = "', 'name = "gen_', 1))
open(f"{W}/idx.toml", "w").write(text)

def run(kind, r):
    cfg = f"{W}/{kind}.toml"
    src = {"g": kiln.data.generator(batches)} if kind == "gen" else None
    with kiln.Run(cfg, overrides={"train.epochs": 2, "train.output_dir": f"{W}/{kind}{r}", "train.progress": "none"}, sources=src) as run:
        h = run.fit(overwrite=True)
    e = [rec for rec in h.records if rec.get("event") == "epoch"]
    return [(round(rec["seconds"], 3), rec.get("input_wait_fraction")) for rec in e]

for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    for kind in ("idx", "gen"):
        print(kind, r, run(kind, r), flush=True)
