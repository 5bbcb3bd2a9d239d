"""Kiln from Python: the runs `kiln` drives from TOML files, as objects (docs/python.md).

    import kiln
    run = kiln.Run("samples/fashion_mnist_mlp.toml", overrides={"train.epochs": 1})
    print(run.plan())
    history = run.fit(on_epoch=print)
    probs = run.predict(x)          # NumPy in, NumPy out

Errors are kiln.Error subclasses (ConfigError, DataError, DeviceError, OutOfMemory, PluginError, NumericError)
carrying Kiln's messages; Ctrl-C during fit finishes the step, writes the checkpoint and raises KeyboardInterrupt.
"""

from __future__ import annotations

import html
import json
import sys
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, MutableMapping, Sequence

import numpy as np

from . import _kiln, _toml, data
from ._kiln import ConfigError, DataError, DeviceError, Error, NumericError, OutOfMemory, PluginError

__version__ = _kiln.__version__
__all__ = [
    "Run", "Plan", "History", "Weights", "devices", "plugins", "conformance", "data",
    "Error", "ConfigError", "DataError", "DeviceError", "OutOfMemory", "PluginError", "NumericError",
]

Record = dict  # one metrics.jsonl record


def _plugin_dirs(extra: Sequence[str | os.PathLike] = ()) -> list[str]:
    """Where the plugins are: $KILN_PLUGIN_PATH when set (the core reads it), else beside this package (an
    installed wheel: kiln/lib/kiln) or in the build tree it was built in (<build>/python/kiln -> <build>/lib/kiln)."""
    dirs: list[str] = []
    if not os.environ.get("KILN_PLUGIN_PATH"):
        here = Path(__file__).resolve().parent
        for d in (here / "lib" / "kiln", here.parent.parent / "lib" / "kiln"):
            if d.is_dir():
                dirs.append(str(d))
                break
    return dirs + [os.fspath(d) for d in extra]


def _override_lines(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """{"train.epochs": 1} -> ["train.epochs=1"] (values written as TOML); "key=value" strings pass as they are."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{k}={_toml.value(v)}" for k, v in overrides.items()]
    return [str(o) for o in overrides]


def _format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


class Plan:
    """`kiln plan`'s result: the per-layer table and each device's step memory against its limit.

    ``str(plan)`` / ``repr(plan)`` is the report `kiln plan` prints; ``devices`` holds each device's breakdown
    (bytes: parameters, gradients, optimizer_state, activations, workspace, input_data, total, limit, notes).
    """

    def __init__(self, d: dict):
        self.report: str = d["report"]
        self.fits: bool = d["fits"]
        self.blocked: bool = d["blocked"]
        self.batch_size: int = d["batch_size"]
        self.devices: list[dict] = d["devices"]
        self._largest = d["largest_batch"]

    def largest_batch(self) -> int:
        """The largest batch size whose training step fits every device's memory limit."""
        return self._largest

    def __repr__(self) -> str:
        return self.report.rstrip("\n")

    def _repr_html_(self) -> str:
        cols = ("parameters", "gradients", "optimizer_state", "activations", "workspace", "input_data", "total")
        head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in ("device",) + cols + ("limit",))
        rows = ""
        for d in self.devices:
            cells = "".join(f"<td>{_format_bytes(d[c])}</td>" for c in cols)
            over = d["limit"] and d["total"] > d["limit"]
            style = ' style="color:#b00"' if over else ""
            rows += f"<tr{style}><td>{html.escape(d['device'])}</td>{cells}<td>{_format_bytes(d['limit'])}</td></tr>"
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"<p><b>kiln plan</b>: batch {self.batch_size} {verdict}; largest batch that fits: {self._largest}</p>"
            f"<table><tr>{head}</tr>{rows}</table>"
            f"<details><summary>full report</summary><pre>{html.escape(self.report)}</pre></details>"
        )


class History:
    """What fit returns: the epochs' figures (as Trainer reports them) and, like Keras's History, ``history``:
    lists per metric (train_loss, test_loss, test_accuracy, ...) over the epochs."""

    def __init__(self, d: dict, records: list[Record]):
        self.steps: int = d["steps"]
        self.seconds: float = d["seconds"]
        self.epochs: list[dict] = d["epochs"]
        self.final: dict | None = d["final"]
        self.records: list[Record] = records  # every metrics.jsonl record of this fit, in order
        self.history: dict[str, list] = {}
        for e in self.epochs:
            for k, v in e.items():
                if k != "epoch":
                    self.history.setdefault(k, []).append(v)

    def __repr__(self) -> str:
        return f"History(steps={self.steps}, seconds={self.seconds:.1f}, epochs={len(self.epochs)}, final={self.final})"


class Weights(MutableMapping):
    """The model's weights by name (``dense_1/kernel``, ...), in model order, as NumPy float32 arrays.

    They are what the run's checkpoint holds (EMA values when [optimizer] ema is set, as `kiln evaluate` uses), as
    the run's loaded model holds them now:

    * Views, without a copy, where the model's memory is host memory: the CPU backend with one device (the
      ``single`` strategy). Each read is an array over the very buffer evaluate and predict compute with: writing
      into it (``w["dense_1.bias"][:] = 0``) changes their results, and ``np.shares_memory`` of two reads is True.
      The array does not own its data; its ``base`` keeps the loaded model (and its device memory) alive, so a view
      stays valid after ``run.close()`` or ``run.fit()``, but it is then no longer the run's model: close() and
      fit() drop it (fit trains a new one), so take ``run.weights`` again. NumPy's ``__dlpack__`` hands the same
      memory on: ``torch.from_dlpack(view)`` and ``jax.dlpack.from_dlpack(view)`` share it without a copy.
    * Copies elsewhere: the Vulkan and CUDA backends (device memory), and several devices (data_parallel,
      model_parallel: the weight lives on each replica or stage). Each read is a fresh copy; writing into it
      changes nothing in the model: assign it back.

    ``is_view(name)`` tells which. Assigning (``w[name] = array``) writes into the loaded model's weight in place,
    on every backend (views of it see the new values); the shape must match and the dtype must be a floating one.
    """

    def __init__(self, core: Any):
        self._core = core
        # Names and shapes only: a view is made afresh on each read (it costs no copy), a copy too (the model's
        # values now, not a stale array a caller may have written into).
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._views: dict[str, bool] = {}
        for name, a, view in core.weights():
            self._shapes[name] = a.shape
            self._views[name] = view

    def _check_name(self, name: str) -> None:
        if name not in self._shapes:
            raise KeyError(f"run.weights[{name!r}]: the model has no such weight (it has {', '.join(self._shapes)})")

    def __getitem__(self, name: str) -> np.ndarray:
        self._check_name(name)
        return self._core.weight(name)[0]

    def is_view(self, name: str) -> bool:
        """Whether ``self[name]`` is a view of the model's memory (CPU backend, one device) rather than a copy."""
        self._check_name(name)
        return self._views[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self._check_name(name)
        a = np.asarray(value)
        if not (np.issubdtype(a.dtype, np.floating)):
            raise TypeError(f"run.weights[{name!r}]: expected a floating-point array, got dtype {a.dtype}")
        if a.shape != self._shapes[name]:
            raise ValueError(
                f"run.weights[{name!r}]: the model's weight has shape {self._shapes[name]}, the array given has "
                f"shape {a.shape}"
            )
        self._core.set_weight(name, np.ascontiguousarray(a, dtype=np.float32))

    def __delitem__(self, name: str) -> None:
        raise TypeError("a model's weights cannot be deleted")

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def __repr__(self) -> str:
        return "Weights(" + ", ".join(f"{k}: {v}" for k, v in self._shapes.items()) + ")"


def _key_set(config: str, overrides: list[str], table: str, key: str) -> bool:
    if any(o.split("=", 1)[0].strip() == f"{table}.{key}" for o in overrides):
        return True
    try:
        import tomllib

        with open(config, "rb") as f:
            return key in tomllib.load(f).get(table, {})
    except Exception:
        return False


def _every_steps_set(config: str, overrides: list[str]) -> bool:
    return _key_set(config, overrides, "log", "every_steps")


def _live_output() -> bool:
    """Whether progress may redraw one line with carriage returns: a terminal, or a Jupyter kernel (the notebook's
    output area applies \r to its stream output, as it does for tqdm's text bar)."""
    try:
        if sys.stdout.isatty():
            return True
    except Exception:
        pass
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class Run:
    """A Kiln run: a TOML file (or a dict, from_dict) with overrides, as `kiln train / plan / evaluate / predict /
    export` use it. The config is validated here (ConfigError naming the file, line and key). ``sources`` gives
    the Python data a file's `{ type = "arrays", id = "ID" }` or `{ type = "generator", id = "ID" }` stages name:
    {"ID": kiln.data.arrays(x, y)} or {"ID": kiln.data.generator(fn)}.

    Use it as a context manager, or call close(), to free the devices a loaded model holds (evaluate, predict and
    weights load the run's checkpoint once and keep it); the training run's lock is held only while fit runs.
    """

    def __init__(
        self,
        config: str | os.PathLike,
        overrides: Mapping[str, Any] | Sequence[str] | None = None,
        *,
        sources: Mapping[str, data.Source] | None = None,
        plugin_dirs: Sequence[str | os.PathLike] = (),
    ):
        self.config = os.fspath(config)
        self.overrides = _override_lines(overrides)
        self._sources = dict(sources or {})  # kept alive: the stages read the arrays in place and call the functions
        arrays, gens = {}, {}
        for k, a in self._sources.items():
            if isinstance(a, data.Arrays):
                arrays[k] = (a.x, a.y)
            elif isinstance(a, data.Generator):
                gens[k] = (a.fn, a.batched, a.takes_epoch)
            else:
                raise TypeError(
                    f"sources[{k!r}]: expected kiln.data.arrays(x, y) or kiln.data.generator(fn), got {type(a).__name__}"
                )
        self._dirs = _plugin_dirs(plugin_dirs)
        self._core = _kiln.RunCore(self.config, self.overrides, self._dirs, arrays, gens)
        self._weights: Weights | None = None
        self._output_dir: str | None = None

    @classmethod
    def from_dict(
        cls,
        config: Mapping[str, Any],
        overrides: Mapping[str, Any] | Sequence[str] | None = None,
        *,
        path: str | os.PathLike | None = None,
        plugin_dirs: Sequence[str | os.PathLike] = (),
    ) -> "Run":
        """A run from a dict laid out as the TOML file ({"run": {...}, "model": {"layers": [...]}, ...}).

        It is written as TOML to ``path`` (default: ``.kiln-<run name>.toml`` in the current directory, so relative
        paths resolve from there and errors name its lines). kiln.data.arrays(x, y) and kiln.data.generator(fn)
        objects may stand for source stages.
        """
        found: dict[str, data.Source] = {}

        def convert(v: Any) -> Any:
            if isinstance(v, (data.Arrays, data.Generator)):
                found[v.id] = v
                return v.stage()
            return v

        text = _toml.dumps(dict(config), convert)
        name = str(config.get("run", {}).get("name", "run"))
        p = Path(path) if path is not None else Path.cwd() / f".kiln-{name}.toml"
        p.write_text(text)
        return cls(p, overrides, sources=found, plugin_dirs=plugin_dirs)

    # -- what the app's subcommands do -------------------------------------------------------------------------

    def plan(self) -> Plan:
        """`kiln plan`: the memory plan of a training step before anything is allocated."""
        return Plan(self._core.plan())

    def fit(
        self,
        on_step: Callable[[Record], Any] | None = None,
        on_epoch: Callable[[Record], Any] | None = None,
        *,
        on_record: Callable[[Record], Any] | None = None,
        overwrite: bool = False,
        overrides: Mapping[str, Any] | Sequence[str] | None = None,
        _resume: bool = False,
    ) -> History:
        """`kiln train`: trains, printing progress as the app does; returns a History.

        on_step / on_epoch receive the "step" / "epoch" records of metrics.jsonl as dicts (on_record: every
        record). Passing on_step logs every step (sets [log] every_steps = 1 unless the config or overrides set
        it). An exception raised by a callback stops the run after that step, with a checkpoint, and propagates.
        Ctrl-C does the same and raises KeyboardInterrupt. ``overwrite``: start over in an output directory that
        holds an earlier run (else refused, as `kiln train` refuses).
        """
        extra = _override_lines(overrides)
        if on_step is not None and not _every_steps_set(self.config, self.overrides + extra):
            extra.append("log.every_steps=1")
        # The app draws its bar only on its own terminal; from Python the output goes through sys.stdout, so ask
        # for the bar where that is a terminal or a notebook (a live line), and keep plain lines elsewhere (logs).
        if _live_output() and not _key_set(self.config, self.overrides + extra, "train", "progress"):
            extra.append('train.progress="bar"')
        records: list[Record] = []

        def dispatch(line: str) -> None:
            rec = json.loads(line)
            records.append(rec)
            if on_record is not None:
                on_record(rec)
            ev = rec.get("event")
            if ev == "step" and on_step is not None:
                on_step(rec)
            elif ev == "epoch" and on_epoch is not None:
                on_epoch(rec)

        self._weights = None
        rep = self._core.fit(dispatch, _resume, overwrite, extra)
        h = History(rep, records)
        last = h.final
        line = f"done: {h.steps} steps in {h.seconds:.1f} s"
        if last is not None and last.get("test_accuracy") is not None:
            line += f", final test accuracy {last['test_accuracy']:.4f}"
            if rep["restored"]:
                line += f" (epoch {last['epoch']}, restored)"
        print(line + f"; metrics in {self.output_dir}/metrics.jsonl", flush=True)
        return h

    def resume(
        self,
        on_step: Callable[[Record], Any] | None = None,
        on_epoch: Callable[[Record], Any] | None = None,
        **kw: Any,
    ) -> History:
        """`kiln train --resume`: continues from the run's last checkpoint (fit's arguments)."""
        return self.fit(on_step, on_epoch, _resume=True, **kw)

    def evaluate(self, data: str = "test") -> dict:
        """`kiln evaluate --data NAME`: loss and accuracy of the run's checkpoint (or of weights assigned through
        run.weights) on [data.NAME]. Returns {loss, accuracy, examples, losses, accuracies, data}."""
        r = self._core.evaluate(data)
        i = self._core.model_info()
        line = (
            f"evaluated {i['checkpoint']} (epoch {i['epoch']}, step {i['step']}, {i['weights']} weights) on "
            f"{r['data']}: {r['examples']} examples, loss {r['loss']:.6g}"
        )
        if r["accuracy"] is not None:
            line += f", accuracy {r['accuracy']:.4g}"
        print(line, flush=True)
        return r

    def predict(self, x: Any) -> np.ndarray:
        """`kiln predict --input`: x of shape (N, input_shape...) or one example (input_shape...) -> (N, columns):
        softmax probabilities for softmax_cross_entropy heads, sigmoid ones for binary cross-entropy from logits,
        raw outputs otherwise; several heads side by side. Uses the checkpoint (loaded once) or assigned weights."""
        return self._core.predict(np.asarray(x))

    def predict_columns(self) -> list[str]:
        """The names `kiln predict` gives the last predict's columns (class_0, ..., or <head>.class_0 ...)."""
        return self._core.predict_columns()

    def export(
        self,
        path: str | os.PathLike,
        format: str | None = None,
        *,
        dtype: str = "float32",
        overwrite: bool = False,
        checkpoint: str | os.PathLike | None = None,
    ) -> None:
        """`kiln export`: the checkpoint's weights as safetensors, or the inference graph as ONNX. ``format``
        defaults from the suffix (.safetensors, .onnx); dtype float32, bfloat16 or float16 (safetensors)."""
        path = os.fspath(path)
        if format is None:
            suffix = Path(path).suffix.lower()
            format = {".safetensors": "safetensors", ".onnx": "onnx"}.get(suffix)
            if format is None:
                raise ConfigError(f"export: cannot tell the format from '{path}'; pass format='safetensors' or 'onnx'")
        self._core.export(path, format, dtype, overwrite, os.fspath(checkpoint) if checkpoint else "")

    @property
    def weights(self) -> Weights:
        """The model's weights by name as NumPy arrays: views of the model's memory on the CPU backend with one
        device, copies elsewhere (see Weights)."""
        if self._weights is None:
            self._weights = Weights(self._core)
        return self._weights

    @property
    def output_dir(self) -> str:
        """[train] output_dir (runs/<name> by default): metrics.jsonl and the checkpoints."""
        if self._output_dir is None:
            self._output_dir = self._core.output_dir()
        return self._output_dir

    def close(self) -> None:
        """Frees the loaded model and its devices (and their memory reservations). The run stays usable."""
        self._weights = None
        self._core.close()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"kiln.Run({self.config!r}, overrides={self.overrides!r})"


def devices(backend: str | None = None, *, plugin_dirs: Sequence[str | os.PathLike] = ()) -> list[dict]:
    """`kiln devices`: every backend's devices (label, name, type, memory, ...); a backend without a usable device
    appears as {"backend": name, "unavailable": why}."""
    return _kiln.devices(_plugin_dirs(plugin_dirs), backend or "")


def plugins(*, plugin_dirs: Sequence[str | os.PathLike] = ()) -> list[dict]:
    """`kiln plugins`: the core and each plugin file with its name, version and what it provides (or its error)."""
    return _kiln.plugins(_plugin_dirs(plugin_dirs))


def conformance(
    backend: str,
    *,
    op: str | None = None,
    case: str | None = None,
    device: int = 0,
    report: str | os.PathLike | None = None,
    matrix: str | os.PathLike | None = None,
    tolerances: str | os.PathLike | None = None,
    plugin_dirs: Sequence[str | os.PathLike] = (),
) -> bool:
    """`kiln conformance --backend B`: checks the backend's ops against the reference, printing a line per case;
    True when every case passed."""
    rc = _kiln.conformance(
        _plugin_dirs(plugin_dirs), backend, device, op or "", case or "",
        os.fspath(report) if report else "", os.fspath(matrix) if matrix else "",
        os.fspath(tolerances) if tolerances else "",
    )
    return rc == 0
