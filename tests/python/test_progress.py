"""fit's progress: one redrawn line in a terminal or a Jupyter kernel, plain lines in a log."""

import sys
import types

import kiln
from conftest import write_mlp


def fake_ipython(shell_class_name):
    shell = type(shell_class_name, (), {})()
    return types.SimpleNamespace(get_ipython=lambda: shell)


def test_a_jupyter_kernel_counts_as_live_output_and_a_terminal_shell_alone_does_not(monkeypatch):
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython("ZMQInteractiveShell"))
    assert kiln._live_output()
    # IPython in a terminal that pytest's capture replaced: not a notebook, and stdout is no terminal.
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython("TerminalInteractiveShell"))
    assert not kiln._live_output()
    monkeypatch.delitem(sys.modules, "IPython")
    assert not kiln._live_output()


def test_fit_draws_the_bar_in_a_notebook_and_plain_lines_in_a_log(tmp_path, capfd, monkeypatch):
    cfg = write_mlp(tmp_path, train_limit=256, test_limit=64)
    kiln.Run(cfg, overrides={"train.epochs": 1, "train.output_dir": str(tmp_path / "log")}).fit()
    log = capfd.readouterr().out
    assert "\r" not in log and "epoch 1/1 batch" in log  # not a terminal: the app's plain lines

    monkeypatch.setitem(sys.modules, "IPython", fake_ipython("ZMQInteractiveShell"))
    kiln.Run(cfg, overrides={"train.epochs": 1, "train.output_dir": str(tmp_path / "nb")}).fit()
    nb = capfd.readouterr().out
    assert "\repoch 1/1 [" in nb  # the bar, redrawn in place by the notebook's output area

    # A config or an override that says how to show progress wins.
    kiln.Run(cfg, overrides={"train.epochs": 1, "train.progress": "lines",
                             "train.output_dir": str(tmp_path / "nb_lines")}).fit()
    assert "\r" not in capfd.readouterr().out
