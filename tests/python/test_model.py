"""A trained run from Python: plan, predict, weights, export, devices and plugins."""

import json
import struct

import numpy as np
import pytest

import kiln
from conftest import write_mlp


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("trained")
    run = kiln.Run(write_mlp(d), overrides={"train.max_steps": 30})
    run.fit()
    yield run
    run.close()


def test_plan_is_structured_and_prints_as_kiln_plan(tmp_path):
    plan = kiln.Run(write_mlp(tmp_path)).plan()
    assert plan.fits and plan.batch_size == 32
    assert plan.largest_batch() > 32
    dev = plan.devices[0]
    assert dev["device"] == "cpu:0" and dev["total"] > 0 and dev["limit"] == 512 << 20
    params = (784 * 64 + 64 + 64 * 10 + 10) * 4
    assert params <= dev["parameters"] < params + 4096  # each tensor aligned
    assert repr(plan).startswith("model: mlp") and "<table>" in plan._repr_html_()


def test_predict_returns_one_row_of_probabilities_per_example(trained):
    x = np.random.default_rng(0).random((7, 1, 28, 28), dtype=np.float32)
    p = trained.predict(x)
    assert p.shape == (7, 10) and p.dtype == np.float32
    assert np.allclose(p.sum(1), 1, atol=1e-5)
    assert trained.predict(x[0]).shape == (1, 10)  # one example without the batch dim
    assert np.allclose(trained.predict(x[3:4]), p[3:4], atol=1e-6)
    assert np.allclose(trained.predict(x.astype(np.float64)), p, atol=1e-6)
    assert trained.predict_columns()[:2] == ["class_0", "class_1"]


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_ten_thousand_predict_calls_leave_memory_flat(trained):
    x = np.random.default_rng(1).random((1, 1, 28, 28), dtype=np.float32)
    for _ in range(1000):  # warm: graphs, allocator blocks, NumPy's caches
        trained.predict(x)
    before = rss_bytes()
    for _ in range(10_000):
        trained.predict(x)
    grown = rss_bytes() - before
    assert grown < 4 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 10,000 predict calls"


def test_weights_read_as_arrays_and_assignment_is_checked(trained):
    w = trained.weights
    assert list(w) == ["dense_1.kernel", "dense_1.bias", "dense_2.kernel", "dense_2.bias"]
    assert w["dense_1.kernel"].shape == (784, 64) and w["dense_1.kernel"].dtype == np.float32
    with pytest.raises(ValueError, match=r"has shape \(64, 10\), the array given has shape \(10, 64\)"):
        w["dense_2.kernel"] = np.zeros((10, 64), np.float32)
    with pytest.raises(TypeError, match="floating"):
        w["dense_2.bias"] = np.zeros(10, np.int32)
    with pytest.raises(KeyError):
        w["nope"] = np.zeros(3)
    old_k, old_b = w["dense_2.kernel"].copy(), w["dense_2.bias"].copy()  # views on the CPU backend
    try:
        w["dense_2.kernel"] = np.zeros((64, 10))
        w["dense_2.bias"] = np.arange(10, dtype=np.float64)
        p = trained.predict(np.zeros((2, 1, 28, 28), np.float32))
        e = np.exp(np.arange(10.0))
        assert np.allclose(p, e / e.sum(), atol=1e-6)  # logits = the bias alone
        assert np.array_equal(trained.weights["dense_2.bias"], np.arange(10, dtype=np.float32))
    finally:
        w["dense_2.kernel"], w["dense_2.bias"] = old_k, old_b


def test_export_writes_safetensors_of_the_checkpoint(trained, tmp_path):
    out = tmp_path / "w.safetensors"
    trained.export(out)
    raw = out.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    assert header["dense_1.kernel"]["shape"] == [784, 64] and header["dense_1.kernel"]["dtype"] == "F32"
    with pytest.raises(kiln.ConfigError):
        trained.export(out)  # exists: refused without overwrite, as `kiln export` refuses
    trained.export(out, overwrite=True, dtype="bfloat16")


def test_devices_and_plugins_list_what_kiln_devices_and_kiln_plugins_show():
    devs = kiln.devices("cpu")
    assert devs and devs[0]["label"] == "cpu:0" and devs[0]["host_addressable"] and devs[0]["total_memory"] > 0
    names = [p.get("name") for p in kiln.plugins()]
    assert "core" in names and "cpu" in names and "data" in names


def test_conformance_runs_the_suite_on_one_op():
    assert kiln.conformance("cpu", op="bias_add") is True
