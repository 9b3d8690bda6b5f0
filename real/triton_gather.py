"""The gather kernel's body: imported only where Triton is wanted (:mod:`real.triton_load`).

Kept apart so that importing :mod:`real` never imports Triton. The function is left
undecorated; :class:`real.triton_load.GatherKernel` compiles it (``triton.jit``) or wraps
it for Triton's CPU interpreter, so the CPU tests run this very code.
"""

from __future__ import annotations

import triton.language as tl


def gather_words(table, n, TILE: tl.constexpr):
    """Copy ``n`` descriptors of 8-byte words between raw addresses.

    ``table`` is int64 ``[3, n]``: destination addresses, source addresses, word counts.
    A persistent grid: program ``p`` of ``P`` takes descriptors ``p, p + P, ...``, so the
    launch size stays fixed however long the job is, and copies each one ``TILE`` words
    at a time (masked at its end, so nothing past a page is read or written). The source
    may be page-locked host memory: under unified addressing its host address is valid on
    the GPU, which is what lets one kernel gather scattered host pages.
    """
    lanes = tl.arange(0, TILE)
    i = tl.program_id(0)
    programs = tl.num_programs(0)
    while i < n:
        dst = tl.load(table + i).to(tl.pointer_type(tl.int64))
        src = tl.load(table + n + i).to(tl.pointer_type(tl.int64))
        words = tl.load(table + 2 * n + i)
        start = 0
        while start < words:  # a while loop: the interpreter cannot range() over a tensor
            at = start + lanes
            inside = at < words
            tl.store(dst + at, tl.load(src + at, mask=inside), mask=inside)
            start += TILE
        i += programs
