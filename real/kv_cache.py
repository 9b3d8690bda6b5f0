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

The cache and its word pattern are built when the cache is, on the device's compute stream
(:meth:`real.device.Device.on_compute_stream`): every fill runs on that stream and every
check on a job stream that first waits for it, so no stream can read the pattern before
it is written. (Built lazily, the pattern would belong to whichever stream first asked,
and the compute stream could read it before that stream had written it.)
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from dataclasses import dataclass

import torch

from kvsim.specs.models import ModelSpec
from real.device_types import DeviceLike

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


def word_pattern(page_words: int, device: torch.device) -> torch.Tensor:
    """A fixed hash of each word's index within a page (int64 ``[page_words]``)."""
    x = torch.arange(page_words, dtype=torch.int64, device=device) * _M1
    x = x ^ (x >> 29)
    x = x * _M2
    return x ^ (x >> 32)


def key_terms(seeds: torch.Tensor, num_layers: int) -> torch.Tensor:
    """Per (block, layer) int64 terms ``[n, num_layers]``: distinct per key and per layer."""
    layers = (torch.arange(1, num_layers + 1, dtype=torch.int64, device=seeds.device)) * _M1
    return seeds[:, None] * _M2 + layers[None, :]


class GpuKVCache:
    """``num_blocks`` blocks of ``geometry`` in ``layout`` on ``device`` (a
    :class:`real.device.Device`: built on its compute stream; or a torch device, for tools
    and tests of CPU tensors: built on torch's current stream).

    A block holding key ``k`` has word ``w`` of layer ``l`` equal to
    ``word_pattern[w] ^ key_terms(seed(k))[l]``: every word differs between keys, layers
    and positions, and a whole job's blocks are filled or checked with a handful of
    batched operations (:meth:`fill_many`, :meth:`mismatch_counts`), whatever its size.
    """

    #: at most this many bytes of blocks per batched operation (bounds temporaries)
    GROUP_BYTES = 64 << 20

    def __init__(
        self,
        geometry: KVGeometry,
        num_blocks: int,
        layout: str = BLOCK_FIRST,
        device: DeviceLike | torch.device | str = "cpu",
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.geometry = geometry
        self.num_blocks = num_blocks
        self.layout = layout
        g = geometry
        if layout == LAYER_MAJOR:
            shape = (g.num_layers, num_blocks, g.page_words)
        else:
            shape = (num_blocks, g.num_layers, g.page_words)
        where: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if isinstance(device, (torch.device, str)):
            self.device = torch.device(device)
        else:
            self.device = device.torch_device
            where = device.on_compute_stream()
        with where:
            self.data = torch.zeros(shape, dtype=g.dtype, device=self.device)
            self._words = word_pattern(g.page_words, self.device)
        self.flat = self.data.view(-1)
        self._block_dim = 1 if layout == LAYER_MAJOR else 0
        self._local = threading.local()

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.geometry.block_bytes

    @property
    def group_blocks(self) -> int:
        return max(1, self.GROUP_BYTES // self.geometry.block_bytes)

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

    # --- patterns, batched

    def _word_pattern(self) -> torch.Tensor:
        return self._words  # built with the cache, on the compute stream

    def _scratch(self, slot: int, shape: tuple[int, ...]) -> torch.Tensor | None:
        """A reusable int64 buffer of ``shape`` for this thread (CPU only: fresh large CPU
        allocations are page-faulted in every time, which a GPU's caching allocator avoids;
        stream threads run concurrently, so each has its own)."""
        if self.device.type != "cpu" or self.geometry.dtype != torch.int64:
            return None
        bufs: dict[int, torch.Tensor] | None = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = {}
        n = 1
        for d in shape:
            n *= d
        buf = bufs.get(slot)
        if buf is None or buf.numel() < n:
            buf = bufs[slot] = torch.empty(n, dtype=torch.int64)
        return buf[:n].view(shape)

    def native_expected(self, seeds: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The contents of blocks with these seeds, in the cache's own order
        (``[n, L, P]`` block-first, ``[L, n, P]`` layer-major); ``out``: ``[n, L, P]``."""
        g = self.geometry
        words = self._word_pattern()[None, None, :]
        terms = key_terms(seeds, g.num_layers)[:, :, None]
        if g.dtype == torch.uint8:
            x = ((words ^ terms) & 0xFF).to(torch.uint8)
        elif out is not None:
            x = torch.bitwise_xor(words, terms, out=out)
        else:
            x = words ^ terms
        return x.transpose(0, 1) if self.layout == LAYER_MAJOR else x

    def _group_shape(self, n: int) -> tuple[int, int, int]:
        g = self.geometry
        return (n, g.num_layers, g.page_words)

    def fill_many(self, blocks: torch.Tensor, seeds: torch.Tensor) -> None:
        """Write each block's key pattern (``blocks``, ``seeds``: int64 on the device)."""
        step = self.group_blocks
        for i in range(0, int(blocks.numel()), step):
            part = seeds[i : i + step]
            out = self._scratch(0, self._group_shape(int(part.numel())))
            vals = self.native_expected(part, out)
            self.data.index_copy_(self._block_dim, blocks[i : i + step], vals)

    def mismatch_counts(self, blocks: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        """Bytes of each block that differ from its key pattern (int64 ``[n]``, on the
        device: nothing here waits for the device)."""
        step = self.group_blocks
        sums = (1, 2) if self.layout == BLOCK_FIRST else (0, 2)
        parts = []
        for i in range(0, int(blocks.numel()), step):
            part, idx = seeds[i : i + step], blocks[i : i + step]
            shape = self._group_shape(int(part.numel()))
            want = self.native_expected(part, self._scratch(1, shape))
            got_out = self._scratch(2, tuple(want.shape))
            if got_out is not None:
                got = torch.index_select(self.data, self._block_dim, idx, out=got_out)
            else:
                got = self.data.index_select(self._block_dim, idx)
            diff = got.bitwise_xor_(want)  # zero where intact
            if diff.dtype != torch.uint8:
                diff = diff.view(torch.uint8)
            parts.append((diff != 0).sum(dim=sums))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    # --- one block (tests, tools)

    def _seed_tensor(self, key: object) -> torch.Tensor:
        return torch.tensor([key_seed(key)], dtype=torch.int64, device=self.device)

    def expected(self, key: object) -> torch.Tensor:
        """The ``[num_layers, page_words]`` contents of a block holding ``key``."""
        x = self.native_expected(self._seed_tensor(key))
        return x[:, 0] if self.layout == LAYER_MAJOR else x[0]

    def fill(self, block: int, key: object) -> None:
        """Write the pattern of ``key`` into ``block`` (emulates the compute that made it)."""
        idx = torch.tensor([block], dtype=torch.int64, device=self.device)
        self.fill_many(idx, self._seed_tensor(key))

    def mismatched_bytes(self, block: int, key: object) -> int:
        """Bytes of ``block`` that differ from the pattern of ``key`` (0 when intact)."""
        idx = torch.tensor([block], dtype=torch.int64, device=self.device)
        return int(self.mismatch_counts(idx, self._seed_tensor(key)).sum().item())
