"""kiln.data.generator: a Python function's iterator of batches as a pipeline's source."""

import os
import signal

import numpy as np
import pytest

import kiln
from test_train import blobs


def blob_batches(epoch, n=1024, size=50):
    """The blobs of test_train, in batches of 50 (not [train] batch_size: Kiln regroups the rows)."""
    x, y = blobs(n, 100 + epoch)
    for i in range(0, n, size):
        yield x[i : i + size], y[i : i + size]


def config(tmp_path, train, test=None, **train_keys):
    d = {
        "run": {"name": "gen", "seed": 3},
        "device": {"backend": "cpu", "memory_limit": "256MiB"},
        "model": {
            "input_shape": [8],
            "loss": "softmax_cross_entropy",
            "layers": [{"type": "dense", "units": 32, "activation": "relu"}, {"type": "dense", "units": 4}],
        },
        "optimizer": {"type": "adam", "learning_rate": 1e-2},
        "train": {"epochs": 3, "batch_size": 32, "output_dir": str(tmp_path / "runs" / "gen"), **train_keys},
        "data": {"train": {"stages": [train, {"type": "batch"}]}},
    }
    if test is not None:
        d["data"]["test"] = {"stages": [test, {"type": "batch"}]}
    return d


def test_a_run_fed_by_a_generator_function_learns(tmp_path):
    epochs_asked = []

    def train(epoch):
        epochs_asked.append(epoch)
        return blob_batches(epoch)

    xt, yt = blobs(256, 2)
    run = kiln.Run.from_dict(config(tmp_path, kiln.data.generator(train), kiln.data.arrays(xt, yt)),
                             path=tmp_path / "gen.toml")
    hist = run.fit()
    assert hist.steps == 3 * 32  # 1024 rows a epoch in batches of 32
    # A fresh iterator each epoch, told which (and one for epoch 0 when the run is built: the first item's shapes).
    assert [e for e in epochs_asked if e > 0] == [1, 2] and epochs_asked[0] == 0
    assert hist.final["test_accuracy"] > 0.95


def test_single_examples_and_a_function_without_arguments(tmp_path):
    x, y = blobs(64, 4)

    def examples():
        for i in range(len(x)):
            yield x[i], y[i]

    run = kiln.Run.from_dict(config(tmp_path, kiln.data.generator(examples, batched=False), epochs=1),
                             path=tmp_path / "gen.toml")
    assert run.fit().steps == 2


def test_resume_after_ctrl_c_continues_a_generator_run_exactly(tmp_path):
    gen = kiln.data.generator(blob_batches)
    ref_steps = []
    ref = kiln.Run.from_dict(config(tmp_path, gen, epochs=2, output_dir=str(tmp_path / "ref")), path=tmp_path / "r.toml")
    ref.fit(on_step=ref_steps.append)

    run = kiln.Run.from_dict(config(tmp_path, gen, epochs=2), path=tmp_path / "g.toml")

    def ctrl_c(r):
        if r["step"] == 40:  # in the second epoch
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        run.fit(on_step=ctrl_c)
    rest = []
    run.resume(on_step=rest.append)
    assert [r["step"] for r in rest] == list(range(41, 65))
    assert [r["loss"] for r in rest] == [r["loss"] for r in ref_steps[40:]]


def test_a_generator_that_raises_gives_a_data_error_naming_it(tmp_path):
    def bad(epoch):
        yield np.zeros((4, 8), np.float32), np.zeros(4)
        raise RuntimeError("the disk went away")

    run = kiln.Run.from_dict(config(tmp_path, kiln.data.generator(bad, id="flaky")), path=tmp_path / "gen.toml")
    with pytest.raises(kiln.DataError, match=r"kiln.data.generator 'flaky': item 4 of epoch 1: the iterator raised "
                                             r"RuntimeError: the disk went away"):
        run.fit()


def test_a_generator_whose_shapes_change_gives_a_data_error(tmp_path):
    def changing(epoch):
        yield np.zeros((4, 8), np.float32), np.zeros(4)
        yield np.zeros((4, 9), np.float32), np.zeros(4)

    with pytest.raises(kiln.DataError, match=r"item 4 of epoch 1 has examples x \(9,\), y \(\), but the first item.s were x \(8,\)"):
        kiln.Run.from_dict(config(tmp_path, kiln.data.generator(changing)), path=tmp_path / "gen.toml").fit()


def test_an_iterator_instead_of_a_function_is_refused():
    with pytest.raises(TypeError, match="function returning an iterator each epoch"):
        kiln.data.generator(blob_batches(0))
