"""Kiln's errors in Python: kiln.Error subclasses with Kiln's messages (file, line, key; the memory report)."""

import numpy as np
import pytest

import kiln
from conftest import write_mlp


def test_a_bad_config_raises_config_error_naming_file_line_and_key(tmp_path):
    cfg = write_mlp(tmp_path)
    lines = cfg.read_text().splitlines()
    at = lines.index("batch_size = 32")
    lines.insert(at + 1, "epochz = 2")
    cfg.write_text("\n".join(lines) + "\n")
    with pytest.raises(kiln.ConfigError) as e:
        kiln.Run(cfg)
    msg = str(e.value)
    assert f"{cfg}:{at + 2}" in msg and "epochz" in msg, msg
    assert isinstance(e.value, kiln.Error)


def test_a_bad_override_raises_config_error_naming_it(tmp_path):
    cfg = write_mlp(tmp_path)
    with pytest.raises(kiln.ConfigError, match="batch_size"):
        kiln.Run(cfg, overrides={"train.batch_size": -3})


def test_from_dict_errors_name_the_written_file_and_key(tmp_path):
    with pytest.raises(kiln.ConfigError) as e:
        kiln.Run.from_dict({"run": {"name": "x"}, "model": {"input_shape": [4], "layers": [{"type": "dense"}]}},
                           path=tmp_path / "x.toml")
    assert str(tmp_path / "x.toml") in str(e.value)


def test_a_step_that_does_not_fit_raises_out_of_memory_with_the_report(tmp_path):
    cfg = write_mlp(tmp_path)
    run = kiln.Run(cfg, overrides={"device.memory_limit": "64KiB"})
    assert not run.plan().fits
    with pytest.raises(kiln.OutOfMemory) as e:
        run.fit()
    assert "DOES NOT FIT" in e.value.report and e.value.report == str(e.value)
    assert isinstance(e.value, kiln.Error)


def test_missing_data_raises_data_error(tmp_path):
    cfg = write_mlp(tmp_path)
    run = kiln.Run(cfg)
    with pytest.raises(kiln.DataError, match="no checkpoint there"):
        run.predict(np.zeros((1, 1, 28, 28), np.float32))


def test_predict_refuses_the_wrong_shape(tmp_path):
    cfg = write_mlp(tmp_path)
    run = kiln.Run(cfg, overrides={"train.max_steps": 2})
    run.fit()
    with pytest.raises(kiln.DataError, match=r"x has shape \(3, 28, 28, 1\).*takes \(N, 1, 28, 28\)"):
        run.predict(np.zeros((3, 28, 28, 1), np.float32))
