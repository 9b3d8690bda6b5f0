"""How a job's runs of words are copied: ``copy_`` per run, a batched driver call, a kernel.

A *run* is ``(dst, src, words)``: word offsets into two flat tensors of the same dtype.

``copy`` is called on the host when a job is submitted, as a CUDA API call is: it enqueues
the job's copies on ``stream`` and returns; the bytes move when the stream reaches them. A
path that copies with tensor operations wraps them in ``stream.run`` (on CUDA that runs them
at once under the stream, on the CPU stand-ins it queues them); the batched path hands the
driver the stream itself. ``prepare`` is called when a backend starts, with the size of the
pages its jobs will copy, so that nothing is compiled inside a timed job.

* :class:`TorchCopy`: one ``Tensor.copy_`` per run (``non_blocking`` on CUDA). The CPU
  path, and the CUDA fallback. Each call costs several microseconds of host time, so
  vLLM's per-layer 64 KiB pages top out near 7-10 GB/s this way.
* :class:`BatchCopy`: vLLM 0.33's copy (``swap_blocks_batch``): the run table is turned
  into numpy arrays of pointers and sizes and handed to ``cuMemcpyBatchAsync`` in one
  call per job (chunked at ``max_descriptors``), resolved at run time through
  cuda-bindings' ``cuGetProcAddress`` with the CUDA 12.8 ABI, exactly as vLLM's
  ``simple_kv_offload/cuda_mem_ops.py`` does. Loads may let the DMA read their source out
  of stream order (``SRC_ACCESS_ORDER_ANY``) when nothing in flight writes it; stores
  always read in stream order (the compute stream may still be writing the KV).
* :class:`KernelLoadCopy`: vLLM 0.33's choice per job. A CPU->GPU job from page-locked
  memory whose pages are under 28 KiB, 16 or more of them, goes through the Triton gather
  kernel (:mod:`real.triton_load`); everything else through the DMA path it wraps. The
  rule is :func:`kvsim.engine.copy_paths.load_uses_kernel`, shared with the simulator.

A job's runs may merge several of vLLM's page descriptors (the backend coalesces pages
contiguous on both sides); ``page_words`` says how long one page is, so the kernel path
counts and copies vLLM's descriptors, not the merged runs. ``None``: each run is a page.

:func:`default_copy_path` picks the batch path on CUDA when the driver has it and the copy
path on CPU, and on CUDA wraps it with the kernel when Triton is importable and a probe
copy succeeded; nothing CUDA-specific (nor Triton) is imported or resolved on a CPU
device. ``calibrate`` and the backend take the path from the same device, so calibration
times what runs, kernel included where vLLM would launch it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from kvsim.core.errors import InputError
from kvsim.engine.copy_paths import KERNEL_WORD_BYTES, load_uses_kernel
from real.device_types import CopyPath, DeviceLike, Run, Stream, cuda_stream_handle

SRC_ACCESS_ORDER_STREAM = 1  # CUmemcpySrcAccessOrder
SRC_ACCESS_ORDER_ANY = 3
BATCH_ABI_VERSION = 12080  # cuMemcpyBatchAsync with failIdx, as vLLM requests it
MAX_DESCRIPTORS = 16384  # per call: ~52k descriptors hung CUDA 13.0 (vLLM issue #49276)
LOAD_MODES = ("auto", "dma", "kernel")  # KVSIM_LOAD_PATH: vLLM's rule, never, or always


class TorchCopy:
    """One ``copy_`` per run, on the stream."""

    name = "copy_"

    def prepare(self, page_bytes: int, device: torch.device) -> None:
        return None

    def route(
        self, dst: torch.Tensor, src: torch.Tensor, runs: Sequence[Run], page_words: int | None
    ) -> str:
        return self.name

    def copy(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        runs: Sequence[Run],
        *,
        stream: Stream,
        stable_source: bool,
        page_words: int | None = None,
    ) -> None:
        nb = dst.is_cuda or src.is_cuda
        table = list(runs)

        def copies() -> None:
            for d, s, n in table:
                dst[d : d + n].copy_(src[s : s + n], non_blocking=nb)

        stream.run(copies)


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("id", ctypes.c_int)]


class MemcpyAttributes(ctypes.Structure):
    """``CUmemcpyAttributes`` (CUDA 12.8)."""

    _fields_ = [
        ("srcAccessOrder", ctypes.c_uint),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


BATCH_FUNC_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_uint,  # CUresult
    ctypes.c_void_p,  # dsts
    ctypes.c_void_p,  # srcs
    ctypes.c_void_p,  # sizes
    ctypes.c_size_t,  # count
    ctypes.c_void_p,  # attrs
    ctypes.c_void_p,  # attrsIdxs
    ctypes.c_size_t,  # numAttrs
    ctypes.c_void_p,  # failIdx
    ctypes.c_void_p,  # hStream
)


def descriptor_arrays(
    dst_base: int, src_base: int, runs: Sequence[Run], word_bytes: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Pointer and size arrays (bytes) for ``runs`` over two base addresses."""
    table = np.asarray(runs, dtype=np.uint64).reshape(-1, 3)
    wb = np.uint64(word_bytes)
    dsts = np.uint64(dst_base) + table[:, 0] * wb
    srcs = np.uint64(src_base) + table[:, 1] * wb
    sizes = table[:, 2] * wb
    return dsts, srcs, sizes


class BatchCopy:
    """One ``cuMemcpyBatchAsync`` per job (``fn``: the driver entry point, or a stand-in
    with the same signature; ``handle_of``: the stream's ``CUstream``).

    The driver is called at once, on the host, with the stream's handle: it reads the
    descriptor arrays during the call and enqueues the copies on that stream (so the arrays
    may go once it returns), and with ``SRC_ACCESS_ORDER_ANY`` may read a load's source at
    any time from the call on, before earlier work on the stream has run."""

    name = "cuMemcpyBatchAsync"

    def __init__(
        self,
        fn: Callable[..., int],
        *,
        num_attrs: int = 1,
        max_descriptors: int = MAX_DESCRIPTORS,
        handle_of: Callable[[Stream], int] = cuda_stream_handle,
    ) -> None:
        self.fn = fn
        self.num_attrs = num_attrs
        self.max_descriptors = max_descriptors
        self.handle_of = handle_of
        self.calls = 0

    def prepare(self, page_bytes: int, device: torch.device) -> None:
        return None

    def route(
        self, dst: torch.Tensor, src: torch.Tensor, runs: Sequence[Run], page_words: int | None
    ) -> str:
        return self.name

    def copy(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        runs: Sequence[Run],
        *,
        stream: Stream,
        stable_source: bool,
        page_words: int | None = None,
    ) -> None:
        if not runs:
            return
        dsts, srcs, sizes = descriptor_arrays(
            dst.data_ptr(), src.data_ptr(), runs, dst.element_size()
        )
        order = SRC_ACCESS_ORDER_ANY if stable_source else SRC_ACCESS_ORDER_STREAM
        attrs = MemcpyAttributes(srcAccessOrder=order)
        attr_idx = ctypes.c_size_t(0)
        fail_idx = ctypes.c_size_t(0)
        handle = self.handle_of(stream)
        step = self.max_descriptors
        for off in range(0, len(sizes), step):
            d, s, z = dsts[off : off + step], srcs[off : off + step], sizes[off : off + step]
            err = self.fn(
                d.ctypes.data,
                s.ctypes.data,
                z.ctypes.data,
                len(z),
                ctypes.addressof(attrs),
                ctypes.addressof(attr_idx),
                self.num_attrs,
                ctypes.addressof(fail_idx),
                handle,
            )
            self.calls += 1
            if err != 0:
                raise RuntimeError(
                    f"cuMemcpyBatchAsync failed: error {err} at descriptor {off + fail_idx.value}"
                )


def resolve_batch_copy() -> tuple[BatchCopy | None, str]:
    """``cuMemcpyBatchAsync`` through cuda-bindings' ``cuGetProcAddress`` (CUDA only);
    ``(None, reason)`` when cuda-bindings or the entry point is missing."""
    try:
        from cuda.bindings import driver as drv
    except ImportError as exc:
        return None, f"cuda-bindings not importable ({exc})"
    try:
        res: Any = drv.cuGetProcAddress(b"cuMemcpyBatchAsync", BATCH_ABI_VERSION, 0)
    except Exception as exc:  # an unexpected binding signature
        return None, f"cuGetProcAddress raised {type(exc).__name__}: {exc}"
    err, ptr = res[0], res[1]
    if err != drv.CUresult.CUDA_SUCCESS or not int(ptr):
        return None, f"cuGetProcAddress(cuMemcpyBatchAsync) failed: {err}"
    return BatchCopy(BATCH_FUNC_TYPE(int(ptr))), "resolved"


class PageKernel(Protocol):
    """Copies pages (``[n, 3]`` element offsets: dst, src, length) on the current stream,
    ``tile`` words at a time (:class:`real.triton_load.GatherKernel`); ``prepare`` compiles
    (and loads) the kernel for one tile size ahead of any timed launch."""

    name: str

    def prepare(self, tile: int, device: torch.device) -> None: ...

    def copy_pages(
        self, dst: torch.Tensor, src: torch.Tensor, pages: npt.NDArray[np.int64], *, tile: int
    ) -> None: ...


def whole_words(dst: torch.Tensor, src: torch.Tensor, pages: npt.NDArray[np.int64]) -> bool:
    """Whether every page starts and ends on an 8-byte boundary on both sides (the kernel
    moves 8-byte words; vLLM checks the page sizes, kvsim's offsets are as aligned)."""
    esize = dst.element_size()
    if (dst.data_ptr() | src.data_ptr()) % KERNEL_WORD_BYTES:
        return False
    return not np.any((pages * esize) % KERNEL_WORD_BYTES)


def _host_to_device(dst: torch.Tensor, src: torch.Tensor) -> bool:
    return dst.is_cuda and not src.is_cuda


def _pinned(t: torch.Tensor) -> bool:
    """The pool's own answer (its registered pieces), or torch's for ``pin_memory()``
    tensors: ``Tensor.is_pinned()`` alone asks about the storage base, not the view."""
    from real.host_pool import host_pinned

    return host_pinned(t)


class KernelLoadCopy:
    """Loads of small pages through the gather kernel, everything else through ``dma``.

    ``mode``: ``auto`` (vLLM's rule), ``kernel`` (every load from pinned memory in whole
    8-byte words, whatever its size and count: for comparisons) or ``dma`` (never).
    ``is_load`` and ``pinned`` say which jobs read page-locked host memory into the GPU
    (tests on CPU tensors replace them). ``jobs`` counts the jobs per path."""

    def __init__(
        self,
        dma: CopyPath,
        kernel: PageKernel,
        *,
        mode: str = "auto",
        is_load: Callable[[torch.Tensor, torch.Tensor], bool] = _host_to_device,
        pinned: Callable[[torch.Tensor], bool] = _pinned,
    ) -> None:
        if mode not in LOAD_MODES:
            raise ValueError(f"load path must be one of {LOAD_MODES}, got {mode!r}")
        self.dma = dma
        self.kernel = kernel
        self.mode = mode
        self.is_load = is_load
        self.pinned = pinned
        self.name = f"{dma.name}+{kernel.name}"
        self.jobs: dict[str, int] = {kernel.name: 0, dma.name: 0}

    def prepare(self, page_bytes: int, device: torch.device) -> None:
        """Compile the kernel's tile for these pages (unless loads never take it)."""
        self.dma.prepare(page_bytes, device)
        if self.mode != "dma":
            from real.triton_load import tile_words

            self.kernel.prepare(tile_words(page_bytes), device)

    def _pages(
        self, dst: torch.Tensor, src: torch.Tensor, runs: Sequence[Run], page_words: int | None
    ) -> npt.NDArray[np.int64] | None:
        """vLLM's page descriptors of this job when it goes through the kernel, else None."""
        if self.mode == "dma" or not runs or not self.is_load(dst, src):
            return None
        from real.triton_load import split_pages

        pages = split_pages(runs, page_words)
        if not whole_words(dst, src, pages):
            return None
        if self.mode == "kernel":
            use = self.pinned(src)
        else:
            page_bytes = int(pages[:, 2].max()) * dst.element_size()
            use = load_uses_kernel(page_bytes, len(pages), pinned=self.pinned(src))
        return pages if use else None

    def route(
        self, dst: torch.Tensor, src: torch.Tensor, runs: Sequence[Run], page_words: int | None
    ) -> str:
        pages = self._pages(dst, src, runs, page_words)
        if pages is not None:
            return self.kernel.name
        return self.dma.route(dst, src, runs, page_words)

    def copy(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        runs: Sequence[Run],
        *,
        stream: Stream,
        stable_source: bool,
        page_words: int | None = None,
    ) -> None:
        pages = self._pages(dst, src, runs, page_words)
        if pages is None:
            self.jobs[self.dma.name] += 1
            self.dma.copy(
                dst, src, runs, stream=stream, stable_source=stable_source, page_words=page_words
            )
            return
        from real.triton_load import tile_words

        self.jobs[self.kernel.name] += 1
        tile = tile_words(int(pages[:, 2].max()) * dst.element_size())
        kernel = self.kernel

        def launch() -> None:
            kernel.copy_pages(dst, src, pages, tile=tile)

        stream.run(launch)


def default_copy_path(
    device: DeviceLike, prefer: str | None = None, load: str | None = None
) -> CopyPath:
    """The batch path on CUDA when available (``KVSIM_COPY_PATH=copy_`` forces ``copy_``),
    with small-page loads through the gather kernel when it resolves
    (``KVSIM_LOAD_PATH=auto|dma|kernel``, default ``auto``: vLLM's rule); always ``copy_``
    on CPU."""
    prefer = prefer or os.environ.get("KVSIM_COPY_PATH", "auto")
    load = load or os.environ.get("KVSIM_LOAD_PATH", "auto")
    if load not in LOAD_MODES:
        raise InputError(f"KVSIM_LOAD_PATH must be one of {', '.join(LOAD_MODES)}, got {load!r}")
    if not device.is_cuda or prefer == TorchCopy.name:
        return TorchCopy()
    batch, _reason = resolve_batch_copy()
    dma: CopyPath = batch if batch is not None else TorchCopy()
    if load == "dma":
        return dma
    from real.triton_load import resolve_gather_kernel

    kernel, _why = resolve_gather_kernel(device)
    return dma if kernel is None else KernelLoadCopy(dma, kernel, mode=load)
