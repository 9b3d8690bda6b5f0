"""The host (CPU tier) pool: one region of ``num_chunks`` padded rows, pinned in pieces.

The row size is vLLM's ``kv_bytes_per_chunk`` (the raw chunk rounded up to 4096 bytes,
see :mod:`kvsim.specs.sizing`), so the pool holds exactly the bytes vLLM would allocate, with
no power-of-two rounding (``pin_memory=True`` would round up). The base is page-aligned
(``torch.empty`` is only 64-byte aligned: pieces of a pool over 64 GiB would then start
mid-page), and the pages are touched once up front (``prefault``) as vLLM pre-faults its
region, so first-touch page faults never land inside a timed copy.

On CUDA the region is page-locked with ``cudaHostRegister`` in row-aligned pieces of at
most 64 GiB (one call over 512 GiB fails, vLLM issue #51080); copies never span two pieces
(``piece_words``). Any failure unregisters the pieces already done, clears the CUDA error
(:mod:`real.cuda_rt`); with ``require_pin`` it then raises, otherwise the pool stays
pageable (transfers still work, only slower), as vLLM does.

Within a row, sub-block ``j`` of layer ``l`` lives at
``l * page * units + j * page`` (layer-major, vLLM's per-tensor slot order) or at
``j * block + l * page`` (block-first).
"""

from __future__ import annotations

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

__all__ = ["HostLayout", "HostPool", "PinError", "aligned_empty", "keep_forever"]

_LEAKED: list[object] = []  # memory a device may still be copying into: never freed


def keep_forever(*objects: object) -> None:
    """Never free these (a device may still be copying into them)."""
    _LEAKED.extend(objects)


def cuda_register(ptr: int, nbytes: int) -> None:
    host_register(ptr, nbytes)


def cuda_unregister(ptr: int) -> None:
    host_unregister(ptr)


def aligned_empty(nbytes: int, dtype: torch.dtype, align: int = HOST_PAGE) -> torch.Tensor:
    """An uninitialised CPU tensor of ``nbytes`` whose first byte is ``align``-aligned."""
    raw = torch.empty(nbytes + align, dtype=torch.uint8)
    start = -raw.data_ptr() % align
    return raw[start : start + nbytes].view(dtype)


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
        self.pieces.clear()

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
