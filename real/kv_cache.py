"""The paged GPU KV cache, in vLLM's layer-major layout or a block-first layout.

A *block* here is one unit of the engine's GPU block pool (``unit_tokens`` tokens). Its
bytes are ``num_layers`` pages of ``page_bytes`` (K and V of that layer, vLLM's LBHNC
page). Two layouts:

* ``layer_major`` (vLLM 0.33): ``[num_layers, num_blocks, page]``; one block is
  ``num_layers`` separate pages, so a transfer needs one copy per (block, layer);
* ``block_first`` (cross-layer blocks): ``[num_blocks, num_layers, page]``; one block is
  one contiguous region, so a run of consecutive blocks is a single copy.

Either way ``block_view(b)`` is the same logical ``[num_layers, page]`` array, and every
computed block is filled from a pattern derived from its key, so a load can be checked
byte for byte wherever the bytes travelled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from kvsim.models import ModelSpec

LAYER_MAJOR = "layer_major"
BLOCK_FIRST = "block_first"
LAYOUTS = (LAYER_MAJOR, BLOCK_FIRST)

_M1 = 0x2545F4914F6CDD1D  # odd multipliers; int64 arithmetic wraps in torch
_M2 = 0x5851F42D4C957F2D


@dataclass(frozen=True)
class KVGeometry:
    """Bytes of one block: ``num_layers`` pages of ``page_bytes``."""

    num_layers: int
    page_bytes: int

    def __post_init__(self) -> None:
        if self.num_layers <= 0 or self.page_bytes <= 0:
            raise ValueError(f"bad KV geometry: {self.num_layers} layers x {self.page_bytes} bytes")

    @property
    def block_bytes(self) -> int:
        return self.num_layers * self.page_bytes

    @property
    def word_bytes(self) -> int:
        """8 when pages are whole int64 words (fast CPU copies), else 1."""
        return 8 if self.page_bytes % 8 == 0 else 1

    @property
    def dtype(self) -> torch.dtype:
        return torch.int64 if self.word_bytes == 8 else torch.uint8

    @property
    def page_words(self) -> int:
        return self.page_bytes // self.word_bytes

    @classmethod
    def from_model(
        cls, spec: ModelSpec, block_tokens: int, *, tp: int = 1, dtype_bytes: int | None = None
    ) -> KVGeometry:
        per_token_layer = spec.kv_bytes_per_token_per_layer(dtype_bytes, tp)
        return cls(spec.num_layers, per_token_layer * block_tokens)


def key_seed(key: object) -> int:
    """A stable 62-bit seed for any key (Python's ``hash`` is salted for strings)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def pattern(
    seed: int, num_layers: int, page_words: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The deterministic ``[num_layers, page_words]`` contents of a block with this seed."""
    x = torch.arange(num_layers * page_words, dtype=torch.int64, device=device)
    x = x * _M1 + (seed * _M2 & 0x3FFFFFFFFFFFFFFF)
    x = x ^ (x >> 29)
    x = x * _M2
    x = x ^ (x >> 32)
    if dtype == torch.uint8:
        x = x & 0xFF
    return x.to(dtype).view(num_layers, page_words)


class GpuKVCache:
    """``num_blocks`` blocks of ``geometry`` in ``layout`` on ``device`` (a torch device)."""

    def __init__(
        self,
        geometry: KVGeometry,
        num_blocks: int,
        layout: str = BLOCK_FIRST,
        device: torch.device | str = "cpu",
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.geometry = geometry
        self.num_blocks = num_blocks
        self.layout = layout
        self.device = torch.device(device)
        g = geometry
        if layout == LAYER_MAJOR:
            shape = (g.num_layers, num_blocks, g.page_words)
        else:
            shape = (num_blocks, g.num_layers, g.page_words)
        self.data = torch.zeros(shape, dtype=g.dtype, device=self.device)
        self.flat = self.data.view(-1)

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.geometry.block_bytes

    def block_view(self, block: int) -> torch.Tensor:
        """Block ``block`` as ``[num_layers, page_words]`` (strided in layer-major)."""
        if self.layout == LAYER_MAJOR:
            return self.data[:, block, :]
        return self.data[block]

    def page_offset(self, block: int, layer: int) -> int:
        """Word offset of (block, layer) in ``flat``."""
        g = self.geometry
        if self.layout == LAYER_MAJOR:
            return (layer * self.num_blocks + block) * g.page_words
        return (block * g.num_layers + layer) * g.page_words

    def expected(self, key: object) -> torch.Tensor:
        g = self.geometry
        return pattern(key_seed(key), g.num_layers, g.page_words, g.dtype, self.device)

    def fill(self, block: int, key: object) -> None:
        """Write the pattern of ``key`` into ``block`` (emulates the compute that made it)."""
        self.block_view(block).copy_(self.expected(key))

    def mismatched_bytes(self, block: int, key: object) -> int:
        """Bytes of ``block`` that differ from the pattern of ``key`` (0 when intact)."""
        got = self.block_view(block)
        want = self.expected(key)
        if got.dtype != torch.uint8:
            got = got.contiguous().view(torch.uint8)
            want = want.view(torch.uint8)
        return int((got != want).sum().item())
