"""Rules on numbers that input checks share, each worded once: what counts as a whole
number (a count, a seed, a limit)."""

from __future__ import annotations

import numbers

__all__ = ["is_whole"]


def is_whole(value: object) -> bool:
    """Whether ``value`` is an integer: a Python ``int`` or a numpy integer (the int it
    holds), but not a bool (``True`` is an ``int`` to Python, yet a count of 1 written as
    ``true`` is a typo) and not a float, even ``3.0`` (a count given as a float is a sign
    the wrong value was passed)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
