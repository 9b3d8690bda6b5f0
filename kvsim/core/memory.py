"""Handing freed memory back to the operating system.

A fleet's steps table is joined from its instances' tables column by column (3.9M rows for
16 instances on the bundled trace), each instance's column let go once copied. Those
columns are many ~0.5 MB blocks inside the C heap, scattered between other objects: glibc
keeps freed heap memory for reuse, and a joined column (one contiguous block of several MB)
cannot reuse it, so the process held the table about 1.7 times over at its peak.
``malloc_trim`` returns the free pages inside the heap, not only its top, to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the system (peak memory, not speed: it walks the
    heap, a few milliseconds on a large one). Changes no value any code can see.

    Returns:
        whether the C library could do it (glibc); False elsewhere, where nothing happens.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
