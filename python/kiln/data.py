"""Data from Python for a Kiln run: NumPy arrays as a pipeline's source stage."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

_ids = itertools.count()


class Arrays:
    """A source stage over NumPy arrays: example i is ``x[i]`` with label ``y[i]``.

    Put it first in a pipeline's ``stages`` (``Run.from_dict``), or name it in a TOML file as
    ``{ type = "arrays", id = "train" }`` and pass ``arrays={"train": kiln.data.arrays(x, y)}`` to ``kiln.Run``.
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
