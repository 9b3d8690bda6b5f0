"""GpuBlockPool's list-backed free queue makes exactly the decisions of a plain ordered queue.

The pool keeps its free queue as a list with a moving head, stale entries for blocks hit while
free, a slack before the head and a cut-off consumed prefix (for speed). The model below is
the same semantics written the obvious way, on an ``OrderedDict``; random operation
sequences must get the same blocks, hits, evictions and counts from both.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable

import pytest

from kvsim.manager.gpu_cache import GpuBlockPool


class OrderedQueuePool:
    """vLLM v1 block-pool semantics on an OrderedDict free queue (the reference)."""

    def __init__(self, num_blocks: int) -> None:
        self.free_q: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.ref = [0] * num_blocks
        self.hash: list[Hashable | None] = [None] * num_blocks
        self.cached: dict[Hashable, int] = {}
        self.copies: dict[Hashable, list[int]] = {}
        self.evictions = 0

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self.free_q):
            return None
        blocks = []
        for _ in range(n):
            block, _ = self.free_q.popitem(last=False)
            old = self.hash[block]
            if old is not None:
                self.hash[block] = None
                self.evictions += 1
                copies = self.copies.get(old)
                if self.cached.get(old) == block:
                    if copies:
                        self.cached[old] = copies.pop(0)
                        if not copies:
                            del self.copies[old]
                    else:
                        del self.cached[old]
                elif copies is not None and block in copies:
                    copies.remove(block)
                    if not copies:
                        del self.copies[old]
            self.ref[block] = 1
            blocks.append(block)
        return blocks

    def acquire_cached(self, keys: list[Hashable]) -> list[int]:
        blocks = []
        for key in keys:
            block = self.cached[key]
            if self.ref[block] == 0:
                del self.free_q[block]
            self.ref[block] += 1
            blocks.append(block)
        return blocks

    def cache_blocks(self, blocks: list[int], keys: list[Hashable]) -> None:
        for block, key in zip(blocks, keys):
            if self.hash[block] is None:
                self.hash[block] = key
                if key in self.cached:
                    self.copies.setdefault(key, []).append(block)
                else:
                    self.cached[key] = block

    def free(self, blocks: list[int]) -> None:
        uncached = []
        for block in reversed(blocks):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free_q[block] = None
                if self.hash[block] is None:
                    uncached.append(block)
        for block in reversed(uncached):
            self.free_q.move_to_end(block, last=False)

    def reset(self) -> None:
        self.cached.clear()
        self.copies.clear()
        self.hash = [None] * len(self.hash)

    def count_free_cached(self, keys: list[Hashable]) -> int:
        return sum(1 for k in keys if self.ref[self.cached[k]] == 0)

    def match_prefix(self, keys: list[Hashable], max_blocks: int) -> int:
        n = 0
        for key in keys:
            if n >= max_blocks or key not in self.cached:
                break
            n += 1
        return n


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("num_blocks", [3, 40, 300])
def test_random_operations_decide_as_an_ordered_queue(seed: int, num_blocks: int) -> None:
    rng = random.Random(seed * 1000 + num_blocks)
    pool, model = GpuBlockPool(num_blocks), OrderedQueuePool(num_blocks)
    held: list[list[int]] = []  # each "request": its blocks
    n_keys = max(4, num_blocks // 2)  # few keys: hits, copies and re-caching happen often
    for _ in range(3000):
        op = rng.random()
        if op < 0.35:
            n = rng.randint(1, max(1, num_blocks // 3))
            got = pool.allocate(n)
            assert got == model.allocate(n)
            if got is not None:
                k = rng.randint(0, n)  # some full blocks get keys, the tail may not
                keys = [rng.randrange(n_keys) for _ in range(k)]
                pool.cache_blocks(got[:k], keys)
                model.cache_blocks(got[:k], keys)
                held.append(got)
        elif op < 0.55:
            keys = [k for k in rng.sample(range(n_keys), 3) if k in model.cached]
            if keys:
                assert pool.count_free_cached(keys) == model.count_free_cached(keys)
                got = pool.acquire_cached(keys)
                assert got == model.acquire_cached(keys)
                held.append(got)
        elif op < 0.99 and held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.free(blocks)
            model.free(blocks)
        elif op >= 0.99:  # a prefix-cache reset, with every block back in the queue
            for blocks in held:
                pool.free(blocks)
                model.free(blocks)
            held = []
            pool.reset()
            model.reset()
        probe = [rng.randrange(n_keys) for _ in range(4)]
        assert pool.match_prefix(probe, 4) == model.match_prefix(probe, 4)
        assert pool.num_free == len(model.free_q)
        assert (pool.evictions, pool.num_cached) == (model.evictions, len(model.cached))
    for blocks in held:  # everything back: the whole queue comes out in the same order
        pool.free(blocks)
        model.free(blocks)
    assert pool.allocate(num_blocks) == model.allocate(num_blocks)


def test_the_queue_stays_proportional_to_the_pool() -> None:
    """Consumed entries are cut off, so a long run does not grow the queue without bound."""
    pool = GpuBlockPool(50)
    for i in range(20_000):
        blocks = pool.allocate(7)
        assert blocks is not None
        pool.cache_blocks(blocks[:6], [(i, j) for j in range(6)])
        pool.free(blocks)
    assert len(pool._queue) < 4 * 50 + 200
    assert pool.num_free == 50
