"""run.weights as views of the model's memory on the CPU backend (one device), copies on Vulkan."""

import gc
import json
import struct

import numpy as np
import pytest

import kiln
from conftest import write_mlp

STEPS = 10


def small_run(dir, name="mlp", steps=STEPS, **overrides):
    return kiln.Run(
        write_mlp(dir, name=name, train_limit=320, test_limit=64), overrides={"train.max_steps": steps, **overrides}
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = small_run(tmp_path_factory.mktemp("views"))
    run.fit()
    yield run
    run.close()


def inputs():
    return np.random.default_rng(3).random((5, 1, 28, 28), dtype=np.float32)


def test_cpu_weights_are_views_of_one_buffer(trained):
    w = trained.weights
    for name in w:
        a = w[name]
        assert w.is_view(name), name
        assert not a.flags.owndata and a.base is not None, f"{name}: a copy, not a view of the model's memory"
        assert a.flags.writeable and a.flags.c_contiguous and a.dtype == np.float32
        assert np.shares_memory(a, trained.weights[name]), name  # two reads: the same memory


def test_writing_into_a_view_changes_predict_and_restoring_it_restores_the_output(trained):
    x = inputs()
    before = trained.predict(x)
    k = trained.weights["dense_1.kernel"]
    saved = k.copy()
    try:
        k[:] = 0  # no assignment through run.weights: the runner computes with this very memory
        zeroed = trained.predict(x)
        assert not np.allclose(zeroed, before)
        # The first layer's output is relu(bias) whatever the input: every row is the same.
        assert np.allclose(zeroed, zeroed[0], atol=1e-6)
    finally:
        k[:] = saved
    assert np.array_equal(trained.predict(x), before)  # bit for bit


def test_assignment_writes_into_the_buffer_views_see(trained):
    w = trained.weights
    b = w["dense_2.bias"]
    saved = b.copy()
    try:
        w["dense_2.bias"] = np.arange(10, dtype=np.float64)
        assert np.array_equal(b, np.arange(10, dtype=np.float32))  # the view taken before sees it
    finally:
        w["dense_2.bias"] = saved
    assert np.array_equal(b, saved)


def test_assigning_a_wrong_shape_names_both_shapes(trained):
    with pytest.raises(ValueError, match=r"'dense_1\.bias'.*has shape \(64,\), the array given has shape \(65,\)"):
        trained.weights["dense_1.bias"] = np.zeros(65, np.float32)


def test_a_view_stays_readable_after_close(tmp_path):
    run = small_run(tmp_path, steps=3)
    run.fit()
    k = run.weights["dense_1.kernel"]
    saved = k.copy()
    run.close()  # the run lets go of its model; the view's base still holds it
    gc.collect()
    assert np.array_equal(k, saved)
    k[:] += 1  # still valid memory, the view's own now
    assert np.array_equal(k, saved + 1)
    # The run loads its checkpoint afresh: a new model, not the one the old view holds.
    fresh = run.weights["dense_1.kernel"]
    assert np.array_equal(fresh, saved) and not np.shares_memory(fresh, k)
    del k
    gc.collect()  # the last view gone: the old model is freed (no crash)
    run.close()


def test_with_ema_the_views_hold_the_ema_weights_export_writes(tmp_path):
    run = small_run(tmp_path, steps=5, **{"optimizer.ema": 0.5})
    try:
        run.fit()
        w = run.weights
        run.export(tmp_path / "w.safetensors")  # the checkpoint's EMA weights, as `kiln export` writes them
        raw = (tmp_path / "w.safetensors").read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8 : 8 + n])
        assert run._core.model_info()["weights"] == "ema"
        for name in w:
            begin, end = header[name]["data_offsets"]
            ema = np.frombuffer(raw[8 + n + begin : 8 + n + end], np.float32).reshape(header[name]["shape"])
            assert w.is_view(name) and np.array_equal(w[name], ema), name
    finally:
        run.close()


def test_a_loaded_model_still_predicts_after_another_run_trains(trained, tmp_path):
    # Another run loads the plugins again, registering every kernel anew; the loaded model's open device must keep
    # running the kernels it found (a view may hold such a model long after its run let go of it).
    x = inputs()
    before = trained.predict(x)
    other = small_run(tmp_path, name="other", steps=2)
    other.fit()
    other.close()
    assert np.array_equal(trained.predict(x), before)


def test_vulkan_weights_are_copies_equal_to_the_cpu_ones(trained, tmp_path):
    if not [d for d in kiln.devices("vulkan") if "unavailable" not in d]:
        pytest.skip("no Vulkan device (the suite runs Vulkan on lavapipe: Debian's mesa-vulkan-drivers)")
    run = small_run(tmp_path, **{"device.backend": "vulkan"})  # the same training as `trained`, on Vulkan
    try:
        run.fit()
        w = run.weights
        for name in w:
            a = w[name]
            assert not w.is_view(name), name
            assert a.flags.owndata, f"{name}: Vulkan's weights are device memory, read back as a copy"
            assert not np.shares_memory(a, w[name])  # each read a fresh copy
            cpu = trained.weights[name]
            assert np.allclose(a, cpu, rtol=1e-3, atol=1e-5), f"{name}: max diff {np.abs(a - cpu).max()}"
        # Assignment still reaches the model on the device.
        w["dense_2.kernel"] = np.zeros((64, 10), np.float32)
        w["dense_2.bias"] = np.arange(10, dtype=np.float32)
        e = np.exp(np.arange(10.0))
        assert np.allclose(run.predict(inputs()), e / e.sum(), atol=1e-5)
        assert np.array_equal(w["dense_2.bias"], np.arange(10, dtype=np.float32))
    finally:
        run.close()


def test_torch_from_dlpack_shares_the_view(trained):
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"torch is not importable in this interpreter ({e})")
    if not hasattr(torch, "from_dlpack"):
        pytest.skip(f"torch {torch.__version__} has no torch.from_dlpack")
    a = trained.weights["dense_1.kernel"]
    t = torch.from_dlpack(a)
    assert t.data_ptr() == a.__array_interface__["data"][0]
    assert tuple(t.shape) == a.shape and t.dtype == torch.float32
    x = inputs()
    before = trained.predict(x)
    saved = a.copy()
    try:
        t.zero_()  # through torch, into the model's memory
        assert not a.any() and not np.allclose(trained.predict(x), before)
    finally:
        a[:] = saved
    assert np.array_equal(trained.predict(x), before)
