"""A small TOML writer for kiln.Run.from_dict and the values of overrides (Python's tomllib only reads)."""

from __future__ import annotations

import math
import re
from typing import Any, Callable

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def key(k: str) -> str:
    return k if _BARE.match(k) else string(k)


def string(s: str) -> str:
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append("\\u%04x" % ord(c))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def value(v: Any, convert: Callable[[Any], Any] | None = None) -> str:
    """One TOML value (inline tables and arrays for nested dicts and lists)."""
    if convert is not None:
        v = convert(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(key(str(k)) + " = " + value(x, convert) for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x, convert) for x in v) + "]"
    if hasattr(v, "item"):  # NumPy scalars
        return value(v.item(), convert)
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as a TOML value")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def dumps(doc: dict, convert: Callable[[Any], Any] | None = None) -> str:
    """The document as TOML: dicts become [tables], lists of dicts [[arrays of tables]]."""
    lines: list[str] = []

    def table(path: list[str], d: dict, header: str | None) -> None:
        if convert is not None:
            d = {k: convert(v) for k, v in d.items()}
        scalars = [(k, v) for k, v in d.items() if not isinstance(v, dict) and not _is_table_array(v)]
        if header is not None and (scalars or not d):
            lines.append(header)
        for k, v in scalars:
            lines.append(f"{key(str(k))} = {value(v, convert)}")
        if scalars or header is not None:
            lines.append("")
        for k, v in d.items():
            sub = path + [key(str(k))]
            if isinstance(v, dict):
                table(sub, v, "[" + ".".join(sub) + "]")
            elif _is_table_array(v):
                for item in v:
                    table(sub, item, "[[" + ".".join(sub) + "]]")

    table([], doc, None)
    return "\n".join(lines).rstrip() + "\n"
