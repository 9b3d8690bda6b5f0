"""The host (CPU tier) pool: one region of ``num_chunks`` padded rows, pinned in pieces.

The row size is vLLM's ``kv_bytes_per_chunk`` (the raw chunk rounded up to 4096 bytes,
see :mod:`kvsim.specs.sizing`), so the pool holds exactly the bytes vLLM would allocate, with
no power-of-two rounding (``pin_memory=True`` would round up). The region is an anonymous
``mmap`` (as vLLM's shared offload region is), so the tensor's *storage* starts on a page,
not only its data: ``torch.empty`` is only 64-byte aligned, and a page-aligned view into a
larger ``torch.empty`` buffer leaves the storage base in an unregistered page, where
``Tensor.is_pinned()`` (which asks CUDA about the storage base, not the view) answers
False for a registered pool. The pages are touched once up front (``prefault``) as vLLM
pre-faults its region, so first-touch page faults never land inside a timed copy.

On CUDA the region is page-locked with ``cudaHostRegister`` in row-aligned pieces of at
most 64 GiB (one call over 512 GiB fails, vLLM issue #51080); copies never span two pieces
(``piece_words``). Any failure unregisters the pieces already done, clears the CUDA error
(:mod:`real.cuda_rt`); with ``require_pin`` it then raises, otherwise the pool stays
pageable (transfers still work, only slower), as vLLM does.

Every registered piece is also recorded here (:func:`is_registered`), so a copy path asks
the pool's registrations whether a tensor is page-locked instead of trusting
``Tensor.is_pinned()`` alone (:func:`host_pinned`), on CUDA and on the CPU stand-ins alike.

Within a row, sub-block ``j`` of layer ``l`` lives at
``l * page * units + j * page`` (layer-major, vLLM's per-tensor slot order) or at
``j * block + l * page`` (block-first).
"""

from __future__ import annotations

import bisect
import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvsim.specs.sizing import PAGE_ALIGNMENT, round_up
from real.cuda_rt import PinError, host_register, host_unregister
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, LAYOUTS, KVGeometry

MAX_REGISTER_BYTES = 64 << 30
HOST_PAGE = 4096

Register = Callable[[int, int], None]  # (pointer, bytes); raises on failure
Unregister = Callable[[int], None]

__all__ = [
    "HostLayout",
    "HostPool",
    "PinError",
    "aligned_empty",
    "host_pinned",
    "is_registered",
    "keep_forever",
]

_LEAKED: list[object] = []  # memory a device may still be copying into: never freed
_REGISTERED: list[tuple[int, int]] = []  # (start, end) byte ranges page-locked by a pool, sorted
_REGISTERED_LOCK = threading.Lock()


def keep_forever(*objects: object) -> None:
    """Never free these (a device may still be copying into them)."""
    _LEAKED.extend(objects)


def cuda_register(ptr: int, nbytes: int) -> None:
    host_register(ptr, nbytes)


def cuda_unregister(ptr: int) -> None:
    host_unregister(ptr)


def aligned_empty(nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor of ``nbytes`` (a positive multiple of the dtype's size) on
    an anonymous ``mmap``: its storage, and so its first byte, starts on a page. The tensor
    keeps the mapping alive; the pages are only backed once touched."""
    if nbytes <= 0:
        raise ValueError(f"a host region needs a positive size, got {nbytes} bytes")
    region = mmap.mmap(-1, nbytes)
    return torch.frombuffer(region, dtype=dtype)


def _record_registered(start: int, nbytes: int) -> None:
    with _REGISTERED_LOCK:
        bisect.insort(_REGISTERED, (start, start + nbytes))


def _forget_registered(start: int) -> None:
    with _REGISTERED_LOCK:
        i = bisect.bisect_left(_REGISTERED, (start, -1))
        if i < len(_REGISTERED) and _REGISTERED[i][0] == start:
            del _REGISTERED[i]


def is_registered(ptr: int, nbytes: int) -> bool:
    """Whether every byte of ``[ptr, ptr + nbytes)`` lies in pieces a pool registered
    (adjacent pieces count as one range; a copy never spans two, but a whole pool does)."""
    end, at = ptr + max(nbytes, 1), ptr
    with _REGISTERED_LOCK:
        i = max(bisect.bisect_right(_REGISTERED, (ptr, float("inf"))) - 1, 0)
        for start, stop in _REGISTERED[i:]:
            if start > at:
                return False
            at = max(at, stop)
            if at >= end:
                return True
    return False


def host_pinned(t: torch.Tensor) -> bool:
    """Whether ``t`` is page-locked host memory: bytes a pool registered (what the pool
    says, for any view of it), or memory torch pinned itself (``pin_memory()``)."""
    if t.device.type != "cpu":
        return False
    if is_registered(t.data_ptr(), t.numel() * t.element_size()):
        return True
    return bool(t.is_pinned())  # torch's pinned allocator (its storage base is the data)


@dataclass(frozen=True)
class HostLayout:
    """Where each (chunk, sub-block, layer) page sits in the pool, in words."""

    geometry: KVGeometry
    units_per_chunk: int
    layout: str = BLOCK_FIRST

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.units_per_chunk <= 0:
            raise ValueError(f"units_per_chunk must be positive, got {self.units_per_chunk}")

    @property
    def raw_chunk_bytes(self) -> int:
        return self.geometry.block_bytes * self.units_per_chunk

    @property
    def row_bytes(self) -> int:
        return round_up(self.raw_chunk_bytes, PAGE_ALIGNMENT)

    @property
    def row_words(self) -> int:
        return self.row_bytes // self.geometry.word_bytes

    def page_offset(self, chunk: int, sub: int, layer: int) -> int:
        g = self.geometry
        base = chunk * self.row_words
        if self.layout == LAYER_MAJOR:
            return base + (layer * self.units_per_chunk + sub) * g.page_words
        return base + (sub * g.num_layers + layer) * g.page_words


class HostPool:
    """``num_chunks`` rows of ``layout.row_bytes``; call :meth:`close` (or use ``with``)."""

    def __init__(
        self,
        layout: HostLayout,
        num_chunks: int,
        *,
        pin: bool = False,
        require_pin: bool = False,
        max_piece_bytes: int = MAX_REGISTER_BYTES,
        register: Register | None = None,
        unregister: Unregister | None = None,
        prefault: bool = True,
    ) -> None:
        if num_chunks <= 0:
            raise ValueError(f"num_chunks must be positive, got {num_chunks}")
        if max_piece_bytes < layout.row_bytes:
            raise ValueError("a pinning piece must hold at least one row")
        self.layout = layout
        self.num_chunks = num_chunks
        self.nbytes = num_chunks * layout.row_bytes
        self.data = aligned_empty(self.nbytes, layout.geometry.dtype)
        if prefault:
            self.data.zero_()
        self.rows_per_piece = max(1, max_piece_bytes // layout.row_bytes)
        self.pinned = False
        self.pin_error: str | None = None
        self.pieces: list[tuple[int, int]] = []  # (pointer, bytes) registered
        self._unregister = unregister
        if pin:
            self._pin(
                register or cuda_register,
                unregister or cuda_unregister,
                require_pin,
            )

    @property
    def piece_words(self) -> int | None:
        """Words per registration piece when the pool has several (no copy crosses one)."""
        if self.rows_per_piece >= self.num_chunks:
            return None
        return self.rows_per_piece * self.layout.row_words

    @property
    def num_pieces(self) -> int:
        return len(self.pieces)

    def _pin(self, register: Register, unregister: Unregister, require: bool) -> None:
        self._unregister = unregister
        piece_bytes = self.rows_per_piece * self.layout.row_bytes
        base = self.data.data_ptr()
        try:
            for start in range(0, self.nbytes, piece_bytes):
                size = min(piece_bytes, self.nbytes - start)
                register(base + start, size)
                self.pieces.append((base + start, size))
                _record_registered(base + start, size)
        except BaseException as exc:
            self._unpin()
            self.pin_error = str(exc) or type(exc).__name__
            if not isinstance(exc, Exception):
                raise
            if require:
                raise PinError(f"pinning the host pool failed: {self.pin_error}") from exc
            return
        self.pinned = True

    def _unpin(self) -> None:
        errors = []
        while self.pieces:
            ptr, _ = self.pieces.pop()
            _forget_registered(ptr)
            try:
                if self._unregister is not None:
                    self._unregister(ptr)
            except Exception as exc:  # keep releasing the rest
                errors.append(str(exc))
        self.pinned = False
        if errors:
            raise PinError("; ".join(errors))

    def close(self) -> None:
        """Unregister every pinned piece; the pool must not be used afterwards."""
        self._unpin()

    def leak(self) -> None:
        """Keep the memory pinned and allocated for the life of the process: for when the
        device may still be copying into it (waiting for it failed)."""
        keep_forever(self.data)
        self.pieces.clear()  # still registered (and recorded as such) for good

    def holds_pinned(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lies in this pool while the pool is page-locked (the pool's own
        answer, which :func:`host_pinned` must agree with)."""
        return self.pinned and self.contains(t)

    def contains(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s bytes lie inside this pool's region."""
        a, base = t.data_ptr(), self.data.data_ptr()
        return base <= a and a + t.numel() * t.element_size() <= base + self.nbytes

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def row(self, chunk: int) -> torch.Tensor:
        """Chunk ``chunk``'s padded row (words)."""
        w = self.layout.row_words
        return self.data[chunk * w : (chunk + 1) * w]

    def block_view(self, chunk: int, sub: int) -> torch.Tensor:
        """Sub-block ``sub`` of ``chunk`` as ``[num_layers, page_words]``."""
        g = self.layout.geometry
        upc = self.layout.units_per_chunk
        row = self.row(chunk)[: upc * g.num_layers * g.page_words]
        if self.layout.layout == LAYER_MAJOR:
            return row.view(g.num_layers, upc, g.page_words)[:, sub, :]
        return row.view(upc, g.num_layers, g.page_words)[sub]
