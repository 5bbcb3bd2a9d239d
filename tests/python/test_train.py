"""kiln.Run.fit from Python: the same losses as `kiln train`, callbacks, NumPy-array data, Ctrl-C and resume."""

import json
import os
import signal

import numpy as np
import pytest

import kiln
from conftest import kiln_app, write_mlp


def step_losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if r["event"] == "step"]


def test_mlp_from_python_gives_the_losses_of_kiln_train(tmp_path, capfd):
    sample = os.path.join(os.environ.get("KILN_SOURCE_DIR", "."), "samples", "fashion_mnist_mlp.toml")
    write_mlp(tmp_path)  # skips without Fashion-MNIST, which the sample reads
    sets = {"train.max_steps": 12, "log.every_steps": 1}
    app = kiln_app("train", sample, *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
                   "--set", f"train.output_dir={tmp_path}/cli")
    assert app.returncode == 0, app.stderr
    cli = step_losses(tmp_path / "cli" / "metrics.jsonl")
    assert len(cli) == 12

    seen = []
    run = kiln.Run(sample, overrides={**sets, "train.output_dir": str(tmp_path / "py")})
    hist = run.fit(on_step=seen.append)
    out = capfd.readouterr().out
    assert [r["loss"] for r in seen] == cli  # the same records, value for value (same seed, same data order)
    assert [r["step"] for r in seen] == list(range(1, 13))
    assert step_losses(tmp_path / "py" / "metrics.jsonl") == cli
    assert hist.steps == 12 and hist.records == seen
    assert "stopped at max_steps = 12" in out and "done: 12 steps" in out  # progress as the app prints it


def test_on_epoch_gets_the_epoch_records_and_history_collects_them(tmp_path):
    cfg = write_mlp(tmp_path, train_limit=256, test_limit=128)
    epochs = []
    hist = kiln.Run(cfg, overrides={"train.epochs": 2}).fit(on_epoch=epochs.append)
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert all(e["event"] == "epoch" and e["test_accuracy"] is not None for e in epochs)
    assert hist.history["train_loss"] == pytest.approx([e["train_loss"] for e in epochs])
    assert hist.final["epoch"] == 2


def blobs(n, seed, classes=4, dim=8):
    """Gaussian blobs around well separated centres: a set any working trainer learns."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(7).normal(0, 3, (classes, dim))
    y = rng.integers(0, classes, n)
    x = centres[y] + rng.normal(0, 0.5, (n, dim))
    return x.astype(np.float32), y


def test_a_run_fed_numpy_arrays_learns(tmp_path):
    x, y = blobs(1024, 1)
    xt, yt = blobs(256, 2)
    cfg = {
        "run": {"name": "blobs", "seed": 3},
        "device": {"backend": "cpu", "memory_limit": "256MiB"},
        "model": {
            "input_shape": [8],
            "loss": "softmax_cross_entropy",
            "layers": [{"type": "dense", "units": 32, "activation": "relu"}, {"type": "dense", "units": 4}],
        },
        "optimizer": {"type": "adam", "learning_rate": 1e-2},
        "train": {"epochs": 3, "batch_size": 32, "output_dir": str(tmp_path / "runs" / "blobs")},
        "data": {
            "train": {"stages": [kiln.data.arrays(x, y), {"type": "shuffle", "buffer": 1024}, {"type": "batch"}]},
            "test": {"stages": [kiln.data.arrays(xt, yt), {"type": "batch"}]},
        },
    }
    run = kiln.Run.from_dict(cfg, path=tmp_path / "blobs.toml")
    hist = run.fit()
    assert hist.history["train_loss"][-1] < 0.5 * hist.history["train_loss"][0]
    assert hist.final["test_accuracy"] > 0.95
    ev = run.evaluate()
    assert ev["examples"] == 256 and ev["accuracy"] > 0.95
    pred = run.predict(xt)
    assert (pred.argmax(1) == yt).mean() > 0.95


def test_ctrl_c_during_fit_writes_a_checkpoint_and_resume_continues_the_same_run(tmp_path):
    cfg = write_mlp(tmp_path)
    ref = kiln.Run(cfg, overrides={"train.max_steps": 12, "train.output_dir": str(tmp_path / "ref")})
    ref_steps = []
    ref.fit(on_step=ref_steps.append)

    run = kiln.Run(cfg, overrides={"train.max_steps": 12})

    def ctrl_c_at_5(r):
        if r["step"] == 5:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in a terminal sends

    with pytest.raises(KeyboardInterrupt, match="checkpoint"):
        run.fit(on_step=ctrl_c_at_5)
    assert (tmp_path / "runs" / "mlp" / "checkpoint.kiln").exists()
    assert step_losses(tmp_path / "runs" / "mlp" / "metrics.jsonl") == [r["loss"] for r in ref_steps[:5]]
    # Python's own SIGINT handler is back: Ctrl-C outside fit raises KeyboardInterrupt as usual.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    rest = []
    run.resume(on_step=rest.append)
    assert [r["step"] for r in rest] == list(range(6, 13))
    assert [r["loss"] for r in rest] == [r["loss"] for r in ref_steps[5:]]


def test_an_exception_in_a_callback_stops_the_run_with_a_checkpoint_and_propagates(tmp_path):
    cfg = write_mlp(tmp_path)

    def boom(r):
        if r["step"] == 3:
            raise ValueError("enough")

    run = kiln.Run(cfg, overrides={"train.max_steps": 12})
    with pytest.raises(ValueError, match="enough"):
        run.fit(on_step=boom)
    assert len(step_losses(tmp_path / "runs" / "mlp" / "metrics.jsonl")) == 3
    assert (tmp_path / "runs" / "mlp" / "checkpoint.kiln").exists()


def test_other_python_threads_run_while_fit_trains(tmp_path):
    import threading
    import time

    cfg = write_mlp(tmp_path, train_limit=2048)
    run = kiln.Run(cfg, overrides={"train.max_steps": 60, "train.evaluate": False})
    ticks, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.05)
    before = ticks[0]
    t0 = time.perf_counter()
    run.fit()  # no callback: the GIL stays released from the first step to the last
    spent = time.perf_counter() - t0
    during = ticks[0] - before
    stop.set()
    t.join()
    # With the GIL held the counter could not move at all while C++ trained.
    assert during > 1000, f"{during} ticks in {spent:.2f} s of fit"


def test_a_toml_file_names_arrays_given_to_the_run(tmp_path):
    x, y = blobs(256, 5)
    cfg = tmp_path / "arrays.toml"
    cfg.write_text(f"""[run]
name = "arrays"

[model]
input_shape = [8]
loss = "softmax_cross_entropy"

[[model.layers]]
type = "dense"
units = 4

[train]
epochs = 1
batch_size = 16
evaluate = false
output_dir = "{tmp_path / 'runs'}"

[data.train]
stages = [{{ type = "arrays", id = "train" }}, {{ type = "batch" }}]
""")
    with pytest.raises(kiln.ConfigError, match=r'no kiln.data.arrays with id "train" was given to this run'):
        kiln.Run(cfg)
    with kiln.Run(cfg, sources={"train": kiln.data.arrays(x, y)}) as run:
        assert run.fit().steps == 16
        assert run.predict(x[:3]).shape == (3, 4)
