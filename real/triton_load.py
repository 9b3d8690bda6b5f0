"""vLLM 0.33's Triton gather kernel for CPU->GPU loads of small pages, and where it runs.

On an H100 vLLM measured one kernel launch beating ``cuMemcpyBatchAsync`` for jobs of at
least 16 pages under 28 KiB (the rule is :func:`kvsim.engine.copy_paths.load_uses_kernel`):
the copy engine pays per descriptor, while a kernel of a few programs reads the scattered
pinned host pages straight over the bus (a page-locked host address is a device address
under unified addressing). This module supplies the kernel in kvsim's terms:

* :func:`page_table`: a job's runs split back into the pages they were merged from (vLLM
  copies one descriptor per page and never merges), as an int64 ``[3, n]`` table of
  destination addresses, source addresses and 8-byte word counts;
* :class:`GatherKernel`: launches the kernel of :mod:`real.triton_gather` over a table, on
  a persistent grid of ``min(12, n)`` programs with tiles of ``next_pow2(largest page)``
  bytes (at most 8 KiB), compiled with ``triton.jit`` on CUDA or run by Triton's CPU
  interpreter (``interpret=True``) so tests execute the same code on CPU tensors;
* :func:`resolve_gather_kernel`: the kernel for a CUDA device once a probe copy from
  page-locked memory came back byte-exact, else ``(None, reason)``. Triton stays optional:
  nothing here imports it before a CUDA device asks.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from kvsim.engine.copy_paths import KERNEL_WORD_BYTES

if TYPE_CHECKING:
    from real.copy_path import Run
    from real.device import Device

MAX_PROGRAMS = 12  # vLLM's NUM_SMS: the smallest slice of an H100 near peak for 8-32 KiB
MAX_TILE_BYTES = 8192
PROBE_PAGES = 17  # at least KERNEL_MIN_DESCRIPTORS, and not a multiple of the grid


def tile_words(page_bytes: int) -> int:
    """Words per tile for pages of at most ``page_bytes``: the next power of two, <= 8 KiB."""
    tile = 1 << max(int(page_bytes) - 1, 1).bit_length()
    return min(tile, MAX_TILE_BYTES) // KERNEL_WORD_BYTES


def split_pages(runs: Sequence[Run], page_words: int | None) -> npt.NDArray[np.int64]:
    """``runs`` as ``[n, 3]`` (dst, src, words) pages of ``page_words`` (a shorter last page
    where a run is not a whole number of them); ``None``: every run is one page."""
    table = np.asarray(runs, dtype=np.int64).reshape(-1, 3)
    if page_words is None or not len(table):
        return table
    if page_words <= 0:
        raise ValueError(f"page_words must be positive, got {page_words}")
    counts = -(-table[:, 2] // page_words)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    within = (np.arange(int(counts.sum()), dtype=np.int64) - first) * page_words
    rows = np.repeat(table, counts, axis=0)
    sizes = np.minimum(rows[:, 2] - within, page_words)
    return np.stack([rows[:, 0] + within, rows[:, 1] + within, sizes], axis=1)


def page_table(
    dst: torch.Tensor, src: torch.Tensor, pages: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The kernel's int64 ``[3, n]`` table for ``pages`` (element offsets into ``dst`` and
    ``src``): byte addresses, then sizes in 8-byte words (every page a whole number)."""
    esize = dst.element_size()
    if src.element_size() != esize:
        raise ValueError("source and destination element sizes differ")
    table = np.stack(
        [
            dst.data_ptr() + pages[:, 0] * esize,
            src.data_ptr() + pages[:, 1] * esize,
            pages[:, 2] * esize,
        ]
    ).astype(np.int64)
    if np.any(table % KERNEL_WORD_BYTES):
        raise ValueError(f"the gather kernel copies aligned {KERNEL_WORD_BYTES}-byte words only")
    table[2] //= KERNEL_WORD_BYTES
    return table


class GatherKernel:
    """The gather kernel, compiled (``interpret=False``, CUDA) or interpreted (CPU)."""

    name = "triton-gather"

    def __init__(self, *, interpret: bool = False) -> None:
        triton = importlib.import_module("triton")
        from real.triton_gather import gather_words

        self.interpret = interpret
        self._fn: Any
        if interpret:
            interpreter = importlib.import_module("triton.runtime.interpreter")
            self._fn = interpreter.InterpretedFunction(gather_words)
        else:
            # one binary for every job length (no recompiles as n changes)
            self._fn = triton.jit(gather_words, do_not_specialize=["n"])
        self.launches = 0

    def copy_pages(
        self, dst: torch.Tensor, src: torch.Tensor, pages: npt.NDArray[np.int64], *, tile: int
    ) -> None:
        """Copy ``pages`` (``[n, 3]`` element offsets) from ``src`` to ``dst`` on the current
        stream; ``tile`` words per step (:func:`tile_words`)."""
        n = len(pages)
        if n == 0:
            return
        table = torch.from_numpy(page_table(dst, src, pages))
        if dst.is_cuda:  # staged through pinned memory; the caching allocator keeps it alive
            table = table.pin_memory().to(dst.device, non_blocking=True)
        self._fn[(min(MAX_PROGRAMS, n),)](table, n, TILE=tile)
        self.launches += 1


_resolved: dict[int, tuple[GatherKernel | None, str]] = {}


def import_triton() -> tuple[Any, str]:
    """``(triton, "importable")``, or ``(None, reason)``."""
    try:
        return importlib.import_module("triton"), "importable"
    except Exception as exc:  # ImportError, or a broken install
        return None, f"triton not importable ({type(exc).__name__}: {exc})"


def resolve_gather_kernel(device: Device) -> tuple[GatherKernel | None, str]:
    """The compiled kernel for a CUDA device, once it copied a probe of 17 pages from
    page-locked host memory byte for byte; ``(None, reason)`` on CPU, without Triton, on
    ROCm, or when the probe fails (no compiler, no unified addressing). Resolved once per
    GPU."""
    if not device.is_cuda:
        return None, "not a CUDA device"
    index = device.torch_device.index or 0
    if index not in _resolved:
        _resolved[index] = _probe(device)
    return _resolved[index]


def _probe(device: Device) -> tuple[GatherKernel | None, str]:
    triton, reason = import_triton()
    if triton is None:
        return None, reason
    if torch.version.hip is not None:
        return None, "ROCm: vLLM keeps host mappings off the Triton path there"
    try:
        kernel = GatherKernel()
        # pages of 3 words (smaller than the tile: the mask is exercised), every other
        # slot, gathered in reverse order; the gaps between them must stay untouched
        page, words = 3, 2 * PROBE_PAGES * 3
        src = torch.arange(words, dtype=torch.int64).pin_memory()
        dst = torch.full((words,), -1, dtype=torch.int64, device=device.torch_device)
        slots = np.arange(PROBE_PAGES, dtype=np.int64) * 2 * page
        pages = np.stack([slots, slots[::-1], np.full(PROBE_PAGES, page)], axis=1)
        kernel.copy_pages(dst, src, pages, tile=tile_words(page * KERNEL_WORD_BYTES))
        torch.cuda.synchronize(device.torch_device)
        want = torch.full((words,), -1, dtype=torch.int64)
        for d, s, w in pages.tolist():
            want[d : d + w] = src[s : s + w]
        if not torch.equal(dst.cpu(), want):
            return None, "the probe copy from page-locked memory came back wrong"
    except Exception as exc:  # no C compiler for Triton's launcher, no UVA, ...
        return None, f"probe failed ({type(exc).__name__}: {exc})"
    return kernel, f"triton {getattr(triton, '__version__', '?')}: probe copy exact"
