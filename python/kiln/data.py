"""Data from Python for a Kiln run: NumPy arrays, or a Python iterator, as a pipeline's source stage."""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Callable, Iterable, Union

import numpy as np

_ids = itertools.count()


class Arrays:
    """A source stage over NumPy arrays: example i is ``x[i]`` with label ``y[i]``.

    Put it first in a pipeline's ``stages`` (``Run.from_dict``), or name it in a TOML file as
    ``{ type = "arrays", id = "train" }`` and pass ``sources={"train": kiln.data.arrays(x, y)}`` to ``kiln.Run``.
    The arrays are read in place (float32, C order; other arrays are converted once, here) and must not be
    resized while a run uses them. Labels: class indices (any integer or float dtype) of shape (N,), or targets
    (N, k...).
    """

    def __init__(self, x: Any, y: Any, id: str | None = None):
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.ascontiguousarray(y, dtype=np.float32)
        if x.ndim < 2:
            raise ValueError(f"kiln.data.arrays: x has shape {x.shape}; expected (N, example dims...), e.g. (N, 1, 28, 28)")
        if y.ndim < 1 or y.shape[0] != x.shape[0]:
            raise ValueError(
                f"kiln.data.arrays: y has shape {y.shape} but x holds {x.shape[0]} examples; expected y of shape "
                f"({x.shape[0]},) (class indices) or ({x.shape[0]}, k...) (targets)"
            )
        if x.shape[0] == 0:
            raise ValueError("kiln.data.arrays: x holds no examples")
        self.x, self.y = x, y
        self.id = id if id is not None else f"arrays{next(_ids)}"

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def stage(self) -> dict:
        """The stage's TOML table."""
        return {"type": "arrays", "id": self.id}

    def __repr__(self) -> str:
        return f"kiln.data.arrays(x {self.x.shape}, y {self.y.shape}, id={self.id!r})"


def arrays(x: Any, y: Any, id: str | None = None) -> Arrays:
    """A source stage over ``x`` (N, example dims...) and labels ``y`` (N,) or (N, k...)."""
    return Arrays(x, y, id)


class Generator:
    """A source stage over a Python function that returns an iterator of ``(x, y)`` items each epoch.

    ``fn(epoch)`` (or ``fn()``) is called at the start of every epoch (0-based) and must return a fresh iterable:
    a generator function is the usual choice. With ``batched=True`` (default) each item is a batch, x (N, example
    dims...) and y (N,) or (N, k...), whose rows are handed on one by one (the pipeline's batch stage regroups them
    into [train] batch_size); with ``batched=False`` each item is one example. Every item must have the first
    item's example shapes. Kiln calls it with the GIL taken, from the thread that pulls the pipeline. A resumed run
    calls fn for the checkpoint's epoch and skips the examples it had used, so resuming is exact when fn yields the
    same items every time it is called with the same epoch.
    """

    def __init__(self, fn: Callable[..., Iterable], batched: bool = True, id: str | None = None):
        if not callable(fn):
            raise TypeError(
                "kiln.data.generator: expected a function returning an iterator each epoch (e.g. a generator "
                f"function), got {type(fn).__name__}; an iterator is used up after one epoch"
            )
        self.fn, self.batched = fn, bool(batched)
        try:
            params = [
                p for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
            ]
        except (TypeError, ValueError):
            params = []
        self.takes_epoch = len(params) > 0
        self.id = id if id is not None else f"generator{next(_ids)}"

    def stage(self) -> dict:
        """The stage's TOML table."""
        return {"type": "generator", "id": self.id}

    def __repr__(self) -> str:
        return f"kiln.data.generator({getattr(self.fn, '__name__', self.fn)!r}, batched={self.batched}, id={self.id!r})"


def generator(fn: Callable[..., Iterable], batched: bool = True, id: str | None = None) -> Generator:
    """A source stage over ``fn(epoch)`` -> iterable of (x, y) batches (or examples, batched=False)."""
    return Generator(fn, batched, id)


Source = Union[Arrays, Generator]
