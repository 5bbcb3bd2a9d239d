"""The MLP sample trained by `kiln train` and by kiln.Run.fit, alternating, each in a fresh process: the seconds of
each epoch from metrics.jsonl (epoch 2 and later: the data is decoded by then), and the ratio Python / CLI.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/step_overhead.py [ROUNDS] [WORK_DIR] [EPOCHS]

(the interpreter the module was built for, with NumPy: Debian's python3 and python3-numpy, as setup.sh installs)

Both runs use the sample's own settings and seed, the same build (build/bin/kiln and the module next to it), and
write their files under WORK_DIR. Each round runs the CLI and Python once, in an order that flips every round.
"""
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAMPLE = os.path.join(ROOT, "samples", "fashion_mnist_mlp.toml")
KILN = os.path.join(ROOT, "build", "bin", "kiln")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
W = sys.argv[2] if len(sys.argv) > 2 else "/tmp/kiln_step_overhead"
EPOCHS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
os.makedirs(W, exist_ok=True)

PY = f"""
import kiln
run = kiln.Run({SAMPLE!r}, overrides={{"train.epochs": {EPOCHS}, "train.output_dir": {{OUT!r}},
                                       "train.progress": "none"}})
run.fit(overwrite=True)
"""


def epochs(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    return [r["seconds"] for r in recs if r.get("event") == "epoch"], [r["train_loss"] for r in recs
                                                                       if r.get("event") == "epoch"]


def cli(out):
    subprocess.run([KILN, "train", SAMPLE, "--overwrite", "--set", f"train.epochs={EPOCHS}", "--set",
                    f'train.output_dir="{out}"', "--set", 'train.progress="none"'], check=True,
                   stdout=subprocess.DEVNULL)
    return epochs(out)


def python(out):
    subprocess.run([sys.executable, "-c", PY.replace("{OUT!r}", repr(out))], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ))
    return epochs(out)


later = {"cli": [], "python": []}
for r in range(ROUNDS):
    order = [("cli", cli), ("python", python)]
    if r % 2:
        order.reverse()
    for name, fn in order:
        secs, losses = fn(os.path.join(W, name))
        later[name] += secs[1:]
        print(f"round {r + 1} {name:<6}: epoch seconds {', '.join(f'{s:.3f}' for s in secs)}; train loss "
              f"{', '.join(f'{l:.6f}' for l in losses)}", flush=True)
c, p = statistics.median(later["cli"]), statistics.median(later["python"])
print(f"epochs 2..{EPOCHS}: kiln train {min(later['cli']):.3f}-{max(later['cli']):.3f} s (median {c:.3f}), "
      f"kiln.Run.fit {min(later['python']):.3f}-{max(later['python']):.3f} s (median {p:.3f}); "
      f"Python / CLI = {p / c:.3f} by median")
