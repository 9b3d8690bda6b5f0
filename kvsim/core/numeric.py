"""Three rules on numbers that input checks share, each worded once: what counts as a whole
number (a count, a seed, a limit), that a whole float read from a file is its int, and the
hint for a number that came as text."""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["is_whole", "text_number_hint", "whole_floats_as_ints"]


def is_whole(value: object) -> bool:
    """Whether ``value`` is an integer: a Python ``int`` or a numpy integer (the int it
    holds), but not a bool (``True`` is an ``int`` to Python, yet a count of 1 written as
    ``true`` is a typo) and not a float, even ``3.0`` (a count given as a float is a sign
    the wrong value was passed)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def whole_floats_as_ints(data: Any) -> Any:
    """``data`` (a file's values: mappings, lists, scalars) with every whole float
    (``4800.0``, ``8e9``) as its int: a transcription of published numbers often writes
    counts so (a spreadsheet's or JSON tool's ``4800.0``), and ``tp: 2.0`` means 2. A float
    field takes an int as it is; ``2.5`` stays a float, so an int field still refuses it.
    Unlike :func:`is_whole`, which judges a value passed in code, this reads a file."""
    if isinstance(data, float) and data.is_integer():
        return int(data)
    if isinstance(data, dict):
        return {k: whole_floats_as_ints(v) for k, v in data.items()}
    if isinstance(data, list):
        return [whole_floats_as_ints(v) for v in data]
    return data


def text_number_hint(value: object) -> str:
    """`` (a number as text: write it unquoted, such as 1000)`` when ``value`` is text that
    reads as a finite number (``'1e3'`` quoted in YAML, or a string from the API), else
    ``""``: the one wording of that hint, appended to the error that refused the text."""
    if not isinstance(value, str):
        return ""
    try:
        x = float(value)
    except ValueError:
        return ""
    if not math.isfinite(x):
        return ""
    plain = str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)
    return f" (a number as text: write it unquoted, such as {plain})"
