"""The GPU prefix cache, with vLLM v1 block-pool semantics.

* free blocks sit in a queue; allocation pops the front (least recently freed);
* a popped block that still holds a hash loses it only then (lazy eviction);
* a cached block hit by a new request leaves the free queue (ref count goes up);
* a finished request frees its blocks tail first, so its tail is evicted before its head;
  blocks without a hash go to the front of the free queue (reused before any cached one);
* a hit never covers the whole prompt: the last prompt token is always recomputed.

Blocks are ``unit_tokens`` long in cache mode (see :mod:`kvsim.keys`) and vLLM's block size in
the timed engine; ``num_blocks = 0`` disables it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class GpuBlockPool:
    """vLLM v1's GPU block pool, so GPU prefix hits decide what reaches the CPU tier as in vLLM."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._ref = [0] * num_blocks
        self._hash: list[Hashable | None] = [None] * num_blocks
        # hash -> the block a hit takes (the oldest cached copy); a hash is any hashable
        # (cache mode: unit keys; the engine: its own)
        self._cached: dict[Hashable, int] = {}
        # hash -> younger copies: two requests that computed the same block both cache it,
        # as vLLM's BlockHashToBlockMap does, so evicting one copy leaves the other
        self._copies: dict[Hashable, list[int]] = {}
        self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.num_blocks > 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return (self.num_blocks - len(self._free)) / self.num_blocks if self.num_blocks else 0.0

    def match_prefix(self, keys: Sequence[Hashable], max_blocks: int) -> int:
        """Number of leading ``keys`` cached (at most ``max_blocks``); no side effects."""
        cached = self._cached
        n = 0
        for key in keys:
            if n >= max_blocks or key not in cached:
                break
            n += 1
        return n

    def count_free_cached(self, keys: Sequence[Hashable]) -> int:
        """How many of these cached blocks sit in the free queue (taking them uses free space)."""
        cached, ref = self._cached, self._ref
        return sum(1 for k in keys if ref[cached[k]] == 0)

    def acquire_cached(self, keys: Sequence[Hashable]) -> list[int]:
        """Take the cached blocks of ``keys`` (all must be cached) for a request."""
        cached, ref, free = self._cached, self._ref, self._free
        blocks = []
        for key in keys:
            block = cached[key]
            if ref[block] == 0:
                del free[block]
            ref[block] += 1
            blocks.append(block)
        return blocks

    def allocate(self, n: int) -> list[int] | None:
        """Pop ``n`` free blocks (evicting their old hashes), or None if too few are free."""
        free = self._free
        if n > len(free):
            return None
        ref, hashes = self._ref, self._hash
        blocks = []
        for _ in range(n):
            block, _ = free.popitem(last=False)
            old = hashes[block]
            if old is not None:
                hashes[block] = None
                self.evictions += 1
                self._forget(old, block)
            ref[block] = 1
            blocks.append(block)
        return blocks

    def _forget(self, key: Hashable, block: int) -> None:
        """Drop ``block`` from the copies of ``key``; the next oldest copy takes over."""
        copies = self._copies.get(key)
        if self._cached.get(key) == block:
            if copies:
                self._cached[key] = copies.pop(0)
                if not copies:
                    del self._copies[key]
            else:
                del self._cached[key]
        elif copies is not None and block in copies:
            copies.remove(block)
            if not copies:
                del self._copies[key]

    def cache_blocks(self, blocks: Sequence[int], keys: Sequence[Hashable]) -> None:
        """Give computed full blocks their hashes; a hash already cached gains a copy."""
        hashes, cached = self._hash, self._cached
        for block, key in zip(blocks, keys):
            if hashes[block] is None:
                hashes[block] = key
                if key in cached:
                    self._copies.setdefault(key, []).append(block)
                else:
                    cached[key] = block

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's blocks, tail first.

        As vLLM's ``BlockPool.free_blocks``: blocks without a hash can never be hit, so they
        go to the front of the queue (reused first, tail first); cached ones to the back,
        so the prefix cache evicts least recently freed first."""
        ref, free, hashes = self._ref, self._free, self._hash
        uncached = []
        for block in reversed(blocks):
            ref[block] -= 1
            if ref[block] == 0:
                free[block] = None
                if hashes[block] is None:
                    uncached.append(block)
        for block in reversed(uncached):
            free.move_to_end(block, last=False)

    def reset(self) -> None:
        """Forget every hash (vLLM's prefix-cache reset); requires no blocks in use."""
        self._cached.clear()
        self._copies.clear()
        self._hash = [None] * self.num_blocks
