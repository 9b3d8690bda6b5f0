"""The GPU prefix cache, with vLLM v1 block-pool semantics.

* free blocks sit in a queue; allocation pops the front (least recently freed);
* a popped block that still holds a hash loses it only then (lazy eviction);
* a cached block hit by a new request leaves the free queue (ref count goes up);
* a finished request frees its blocks tail first, so its tail is evicted before its head;
  blocks without a hash go to the front of the free queue (reused before any cached one);
* a hit never covers the whole prompt: the last prompt token is always recomputed.

Blocks are ``unit_tokens`` long in cache mode (see :mod:`kvsim.core.keys`) and vLLM's block size in
the timed engine; ``num_blocks = 0`` disables it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import islice, takewhile
from operator import itemgetter

_FRONT_SLACK = 64  # spare slots kept before the queue's head for blocks freed to the front


class GpuBlockPool:
    """vLLM v1's GPU block pool, so GPU prefix hits decide what reaches the CPU tier as in vLLM.

    The free queue is a list read from ``_head`` on, so taking ``n`` blocks is one slice (the
    engine allocates millions of blocks); blocks freed to the back are appended, to the
    front written just before the head. A cached block hit while free leaves the queue
    lazily: its entry stays, counted in ``_stale_of[block]``, and is dropped when the head
    reaches it. A block's stale entries always come before its live one: a hit block is
    cached, so it is freed to the back, and it keeps its hash until it is popped, which
    happens only past all its older entries.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._queue: list[int] = list(range(num_blocks))  # free queue from _head on, front first
        self._head = 0
        self._stale_of: dict[int, int] = {}  # block -> its stale entries from the head on
        self._n_stale = 0
        self._n_free = num_blocks
        self._ref = [0] * num_blocks
        self._hash: list[Hashable | None] = [None] * num_blocks
        # hash -> the block a hit takes (the oldest cached copy); a hash is any hashable
        # (cache mode: unit keys; the engine: its own)
        self._cached: dict[Hashable, int] = {}
        # hash -> younger copies: two requests that computed the same block both cache it,
        # as vLLM's BlockHashToBlockMap does, so evicting one copy leaves the other
        self._copies: dict[Hashable, list[int]] = {}
        self.evictions = 0
        # change counters, so a caller that asks the same question at every step (a waiting
        # request's hit) can keep its answer while they stand still: ``lost_seq`` moves when
        # a hash leaves the cache or passes to another copy (a prefix match can then only
        # have grown), ``held_seq`` also when a cached block enters or leaves the free queue
        # (the answer of ``count_free_cached`` stands while it stands)
        self.lost_seq = 0
        self.held_seq = 0

    @property
    def enabled(self) -> bool:
        return self.num_blocks > 0

    @property
    def num_free(self) -> int:
        return self._n_free

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return (self.num_blocks - self._n_free) / self.num_blocks if self.num_blocks else 0.0

    def match_prefix(self, keys: Sequence[Hashable], max_blocks: int, known: int = 0) -> int:
        """Number of leading ``keys`` cached (at most ``max_blocks``); no side effects.

        ``known``: leading keys the caller knows are cached (an earlier answer for these keys,
        at most ``max_blocks``, with ``lost_seq`` unchanged since): only those past them are
        tried."""
        if max_blocks <= known:
            return max(max_blocks, 0)
        # up to the first miss, tested in C (a waiting request is tried again every step)
        tried = islice(keys, known, max_blocks)
        return known + len(list(takewhile(self._cached.__contains__, tried)))

    def count_free_cached(self, keys: Sequence[Hashable]) -> int:
        """How many of these cached blocks sit in the free queue (taking them uses free space)."""
        if len(keys) < 2:  # itemgetter of one item gives the item, not a tuple
            return sum(self._ref[self._cached[k]] == 0 for k in keys)
        # both lookups in C: an admission with a long hit counts hundreds of blocks
        refs: tuple[int, ...] = itemgetter(*itemgetter(*keys)(self._cached))(self._ref)
        return refs.count(0)

    def acquire_cached(self, keys: Sequence[Hashable]) -> list[int]:
        """Take the cached blocks of ``keys`` (all must be cached) for a request."""
        cached, ref, stale_of = self._cached, self._ref, self._stale_of
        self.held_seq += 1
        blocks = []
        for key in keys:
            block = cached[key]
            if ref[block] == 0:  # it leaves the free queue: its entry goes stale
                stale_of[block] = stale_of.get(block, 0) + 1
                self._n_stale += 1
                self._n_free -= 1
            ref[block] += 1
            blocks.append(block)
        return blocks

    def allocate(self, n: int) -> list[int] | None:
        """Pop ``n`` free blocks (evicting their old hashes), or None if too few are free."""
        if n > self._n_free:
            return None
        self._n_free -= n
        if self._n_stale:
            blocks = self._pop_past_stale(n)
        else:
            head = self._head
            blocks = self._queue[head : head + n]
            self._head = head + n
        if self._head > self.num_blocks + _FRONT_SLACK:  # amortized: the queue stays O(blocks)
            self._cut_consumed()
        ref, hashes, cached, copies = self._ref, self._hash, self._cached, self._copies
        unhashed = 0  # counted on the rare side: most popped blocks evict a hash
        for block in blocks:
            ref[block] = 1
            old = hashes[block]
            if old is None:
                unhashed += 1
                continue
            hashes[block] = None
            if copies and old in copies:
                self._forget(old, block)
            else:  # its only copy: a hashed block is the cached one or one of its copies
                del cached[old]
        if unhashed < n:
            self.evictions += n - unhashed
            self.lost_seq += 1
            self.held_seq += 1
        return blocks

    def _pop_past_stale(self, n: int) -> list[int]:
        """Take ``n`` live entries from the head, dropping the stale ones on the way."""
        queue, stale_of = self._queue, self._stale_of
        head = self._head
        blocks = queue[head : head + n]
        # mostly the stale entries lie further back: then the next n are all live (a block
        # with no stale entry has only its live one), found in C
        if stale_of.keys().isdisjoint(blocks):
            self._head = head + n
            return blocks
        blocks = []
        while len(blocks) < n:
            block = queue[head]
            head += 1
            stale = stale_of.get(block)
            if stale is None:
                blocks.append(block)
            else:
                if stale == 1:
                    del stale_of[block]
                else:
                    stale_of[block] = stale - 1
                self._n_stale -= 1
        self._head = head
        return blocks

    def _cut_consumed(self) -> None:
        """Drop the consumed prefix of the queue, keeping a little room before the head for
        blocks freed to the front."""
        del self._queue[: self._head - _FRONT_SLACK]
        self._head = _FRONT_SLACK

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
        hashes, setdefault = self._hash, self._cached.setdefault
        for block, key in zip(blocks, keys):
            if hashes[block] is None:
                hashes[block] = key
                # an unhashed block is nobody's cached copy, so another block answering means
                # the hash was cached already
                if setdefault(key, block) != block:
                    self._copies.setdefault(key, []).append(block)

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's blocks, tail first.

        As vLLM's ``BlockPool.free_blocks``: blocks without a hash can never be hit, so they
        go to the front of the queue (reused first, tail first); cached ones to the back,
        so the prefix cache evicts least recently freed first."""
        ref, hashes, queue = self._ref, self._hash, self._queue
        self.held_seq += 1
        append = queue.append
        before = len(queue)
        uncached = []
        for block in reversed(blocks):
            left = ref[block] - 1
            ref[block] = left
            if not left:
                if hashes[block] is None:
                    uncached.append(block)
                else:
                    append(block)
        self._n_free += len(queue) - before + len(uncached)
        if uncached:
            self._push_front(uncached)

    def _push_front(self, blocks: list[int]) -> None:
        """Put ``blocks`` at the front of the queue, ``blocks[0]`` first."""
        queue = self._queue
        head = self._head
        if head < len(blocks):  # make room before the head
            room = len(blocks) + _FRONT_SLACK
            queue[0:0] = [-1] * room
            head += room
        head -= len(blocks)
        queue[head : head + len(blocks)] = blocks
        self._head = head

    def reset(self) -> None:
        """Forget every hash (vLLM's prefix-cache reset); requires no blocks in use."""
        self._cached.clear()
        self._copies.clear()
        self.lost_seq += 1
        self.held_seq += 1
        self._hash = [None] * self.num_blocks
        # drop the stale entries now: with no hashes, a block could be freed to the front,
        # ahead of its stale entries
        if self._n_stale:
            live = self._pop_past_stale(self._n_free)
            self._queue = [-1] * _FRONT_SLACK + live
            self._head = _FRONT_SLACK
            self._stale_of.clear()
            self._n_stale = 0
