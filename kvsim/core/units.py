"""Byte counts as people read them: binary units (memory is bought in GiB, and vLLM's
``--kv-offloading-size`` is GiB), next to the exact count so nothing is lost."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["GIB", "bytes_and_human", "human_bytes", "is_byte_count", "with_human_bytes"]

GIB = 1 << 30
#: the longest prompt or output length a generator takes: past any model's context (1M
#: tokens), short of a hang or a MemoryError (a prompt's block ids are built one by one)
MOST_TOKENS = 100_000_000
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps the number >= 1: ``64.0 MiB``,
    ``1.50 GiB``, ``512 B`` (three significant digits); a count past any float (a tier
    of 1e300 GiB asked for) by its number of digits: ``~10^309 B``."""
    try:
        value = float(n)
    except OverflowError:
        return f"~10^{len(str(abs(int(n)))) - 1} B"
    unit = 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(n):,} B" if float(n).is_integer() else f"{value:.1f} B"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:,.{digits}f} {_UNITS[unit]}"


def is_byte_count(key: str) -> bool:
    """Summary keys that hold a byte count, by kvsim's naming: ``bytes``, ``*_bytes`` and
    ``bytes_*`` (``bytes_loaded``, ``chunk_bytes``, ``cpu_bytes``), but not rates."""
    return (
        key == "bytes" or key.endswith("_bytes") or key.startswith("bytes_")
    ) and "per_s" not in key


def bytes_and_human(n: int) -> str:
    """``1,073,741,824 (1.00 GiB)``: the exact count first, so text stays greppable."""
    return f"{n:,} ({human_bytes(n)})"


def with_human_bytes(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with each integer byte count shown as :func:`bytes_and_human` text (for
    text output only; JSON keeps the numbers)."""
    return {
        k: bytes_and_human(v)
        if is_byte_count(k) and isinstance(v, int) and not isinstance(v, bool)
        else v
        for k, v in summary.items()
    }
