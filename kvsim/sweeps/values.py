"""How a sweep's checks show a bad value, and what counts as a number."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def shown(v: Any) -> str:
    """A bad value as the user wrote it; numbers YAML read as text get a hint."""
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return f"a list ({v!r})"
    if isinstance(v, Mapping):
        return f"a mapping ({dict(v)!r})"
    if isinstance(v, str):
        try:
            x = float(v)
        except ValueError:
            return repr(v)
        if not math.isfinite(x):
            return f"the text {v!r}"
        plain = str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)
        return f"the text {v!r} (write a plain number such as {plain})"
    return repr(v)
