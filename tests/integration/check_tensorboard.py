"""Reads a Kiln run directory's TensorBoard event files with TensorBoard's EventAccumulator and checks every scalar
against metrics.jsonl (step records: loss, learning_rate, grad_norm; epoch records: train_loss, test_loss,
test_accuracy). Prints "N scalars agree" and exits 0, or names the first difference and exits 1.
  python check_tensorboard.py RUN_DIR"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run = sys.argv[1]
acc = EventAccumulator(run, size_guidance={"scalars": 0})
acc.Reload()
got = {(e.step, tag): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
n = 0
for line in open(f"{run}/metrics.jsonl"):
    r = json.loads(line)
    keys = ("loss", "learning_rate", "grad_norm") if r["event"] == "step" else ("train_loss", "test_loss", "test_accuracy")
    for k in keys:
        want, have = r[k], got.get((r["step"], k))
        if have is None or not math.isclose(have, want, rel_tol=1e-6, abs_tol=1e-7):
            print(f"step {r['step']} {k}: metrics.jsonl {want}, TensorBoard {have}")
            sys.exit(1)
        n += 1
print(f"{n} scalars agree")
