"""The fleet's steps join hands the instances' freed columns back to the system
(``kvsim.core.memory``): without it the join held the table about 1.7 times over."""

from __future__ import annotations

import os
import sys

import pytest

from kvsim.core.memory import release_freed_memory

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_blocks_between_live_ones_go_back_to_the_system() -> None:
    """64 KB blocks (below glibc's mmap threshold: the heap) with small live blocks between
    them, as an instance's columns sit between other objects: freeing them leaves their
    pages resident, since none is at the heap's top; the release returns them."""
    big: list[bytearray] = []
    keep: list[bytearray] = []
    for _ in range(1500):  # about 96 MB
        block = bytearray(64 * 1024)
        block[::PAGE] = b"x" * len(block[::PAGE])  # touch every page
        big.append(block)
        keep.append(bytearray(2048))
    del block
    before = _rss_bytes()
    big.clear()
    freed = _rss_bytes()
    assert release_freed_memory()
    after = _rss_bytes()
    assert before - after > 48 * 2**20, (before, freed, after)
    assert len(keep) == 1500 and all(len(k) == 2048 for k in keep)  # live blocks untouched
