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
* :func:`resolve_gather_kernel`: the kernel for a CUDA device once a probe copy came back
  byte-exact, else ``(None, reason)``. The probe reads memory page-locked the way the host
  pool is (``cudaHostRegister``, not ``pin_memory()``: the kernel dereferences the host
  address, which must be usable on the device) with the 8 KiB tile that every page over
  4 KiB uses. Triton stays optional: nothing here imports it before a CUDA device asks.

A tile size is compiled (and its module loaded) by :meth:`GatherKernel.prepare`, which a
backend calls when it starts, for the page size of its jobs: a compile takes seconds and
must never land inside a timed job (``unprepared_launches`` counts launches that could
have). On CUDA the page table reaches the device through one pinned staging ring
(:mod:`real.staging`), each slice reused only once the launch that read it completed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvsim.engine.copy_paths import KERNEL_WORD_BYTES
from real.device_types import DeviceLike, Run
from real.staging import StagingBuffer, pinned_words

MAX_PROGRAMS = 12  # vLLM's NUM_SMS: the smallest slice of an H100 near peak for 8-32 KiB
MAX_TILE_BYTES = 8192
PROBE_PAGES = 17  # at least KERNEL_MIN_DESCRIPTORS, and not a multiple of the grid
PROBE_TILE = MAX_TILE_BYTES // KERNEL_WORD_BYTES  # the tile of every page over 4 KiB
PROBE_PAGE_WORDS = (3, PROBE_TILE, PROBE_TILE + 500)  # under, at and over one tile
STAGING_WORDS = 1 << 16  # page tables of several thousand pages in flight


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
        self.tiles: set[int] = set()  # tile sizes prepared (compiled and loaded)
        self.unprepared_launches = 0  # launches of a tile no prepare() had compiled
        self._staging: StagingBuffer | None = None

    def prepare(self, tile: int, device: torch.device) -> None:
        """Compile and load the kernel for ``tile`` words with one small device-to-device
        copy (checked), so no job pays for it; once per tile size."""
        if tile in self.tiles:
            return
        words = 2 * tile + 8
        src = torch.arange(words, dtype=torch.int64, device=device)
        dst = torch.full((words,), -1, dtype=torch.int64, device=device)
        pages = np.array([[0, words - tile - 5, tile + 5], [tile + 6, 0, 2]], dtype=np.int64)
        self._launch(dst, src, pages, tile)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        want = torch.full((words,), -1, dtype=torch.int64)
        for d, s_, w in pages.tolist():
            want[d : d + w] = torch.arange(s_, s_ + w)
        if not torch.equal(dst.cpu(), want):
            raise RuntimeError(f"the gather kernel's tile of {tile} words copied wrong bytes")
        self.tiles.add(tile)

    def copy_pages(
        self, dst: torch.Tensor, src: torch.Tensor, pages: npt.NDArray[np.int64], *, tile: int
    ) -> None:
        """Copy ``pages`` (``[n, 3]`` element offsets) from ``src`` to ``dst`` on the current
        stream; ``tile`` words per step (:func:`tile_words`)."""
        if len(pages) == 0:
            return
        if tile not in self.tiles:
            self.unprepared_launches += 1
        self._launch(dst, src, pages, tile)
        self.launches += 1

    def _launch(
        self, dst: torch.Tensor, src: torch.Tensor, pages: npt.NDArray[np.int64], tile: int
    ) -> None:
        n = len(pages)
        table = torch.from_numpy(page_table(dst, src, pages))
        if not dst.is_cuda:  # Triton's interpreter reads the host table directly
            self._fn[(min(MAX_PROGRAMS, n),)](table, n, TILE=tile)
            return
        if self._staging is None:
            self._staging = StagingBuffer(pinned_words, STAGING_WORDS)
        lease = self._staging.take(3 * n)
        lease.words.copy_(table.view(-1))
        on_device = lease.words.to(dst.device, non_blocking=True)
        self._fn[(min(MAX_PROGRAMS, n),)](on_device, n, TILE=tile)
        fence = torch.cuda.Event()
        fence.record()  # the current stream: the one the table's copy and the launch are on
        lease.guard(fence)


_resolved: dict[int, tuple[GatherKernel | None, str]] = {}


def import_triton() -> tuple[Any, str]:
    """``(triton, "importable")``, or ``(None, reason)``."""
    try:
        return importlib.import_module("triton"), "importable"
    except Exception as exc:  # ImportError, or a broken install
        return None, f"triton not importable ({type(exc).__name__}: {exc})"


def resolve_gather_kernel(device: DeviceLike) -> tuple[GatherKernel | None, str]:
    """The compiled kernel for a CUDA device, once it copied a probe of 17 pages from
    host memory registered as the pool's is, byte for byte; ``(None, reason)`` on CPU,
    without Triton, on ROCm, when pinning is refused (the kernel reads pinned memory only)
    or when the probe fails (no compiler, no unified addressing). Resolved once per GPU."""
    if not device.is_cuda:
        return None, "not a CUDA device"
    index = device.torch_device.index or 0
    if index not in _resolved:
        _resolved[index] = _probe(device)
    return _resolved[index]


def _probe(device: DeviceLike) -> tuple[GatherKernel | None, str]:
    triton, reason = import_triton()
    if triton is None:
        return None, reason
    if torch.version.hip is not None:
        return None, "ROCm: vLLM keeps host mappings off the Triton path there"
    kernel, why = probe_copy(device, GatherKernel)
    version = getattr(triton, "__version__", "?")
    return kernel, (f"triton {version}: {why}" if kernel is not None else why)


def probe_copy(
    device: DeviceLike, make_kernel: Callable[[], GatherKernel]
) -> tuple[GatherKernel | None, str]:
    """Gather 17 pages of 3, 1024 and 1524 words (under, at and over the 8 KiB tile), in
    reverse order with a gap after each, from a small pool registered as the host pool is,
    into ``device`` memory; the kernel when every word, and no gap, came back right."""
    from real.host_pool import HostLayout, HostPool, PinError
    from real.kv_cache import KVGeometry

    sizes = np.resize(np.array(PROBE_PAGE_WORDS, dtype=np.int64), PROBE_PAGES)
    slots = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]])
    words = int(slots[-1] + sizes[-1] + 1)
    try:
        pool = HostPool(
            HostLayout(KVGeometry(1, 4096), 1), -(-words // 512), pin=True, require_pin=True
        )
    except PinError as exc:
        return None, f"pinning refused, and the kernel reads page-locked memory only ({exc})"
    try:
        kernel = make_kernel()
        src = pool.data[:words]
        src.copy_(torch.arange(words, dtype=torch.int64))
        dst = torch.full((words,), -1, dtype=torch.int64, device=device.torch_device)
        pages = np.stack([slots, slots[::-1], sizes], axis=1)
        kernel.copy_pages(dst, src, pages, tile=PROBE_TILE)
        device.run_pending()
        want = torch.full((words,), -1, dtype=torch.int64)
        for d, s, w in pages.tolist():
            want[d : d + w] = src[s : s + w]
        if not torch.equal(dst.cpu(), want):
            return None, "the probe copy from page-locked memory came back wrong"
        kernel.tiles.add(PROBE_TILE)
    except Exception as exc:  # no C compiler for Triton's launcher, no UVA, ...
        return None, f"probe failed ({type(exc).__name__}: {exc})"
    finally:
        try:
            device.run_pending()
            pool.close()
        except Exception:  # the device failed: it may still read the pool, so keep it
            pool.leak()
    return kernel, "probe copy from registered memory exact"
