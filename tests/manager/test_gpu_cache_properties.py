"""Hypothesis: GpuBlockPool decides as a plain list model of vLLM v1's block pool.

The model keeps the free queue as a list (front first) and does every step the obvious way,
one block at a time. Hypothesis drives random allocate / acquire / cache / free / reset
sequences, including inputs the engine rarely makes (a key listed twice in one hit, two
blocks cached under one hash, blocks that already hold a hash cached again), and after every
step the pool must agree with the model on blocks, counts, evictions and prefix hits.
"""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.manager.gpu_cache import GpuBlockPool

KEYS = st.integers(0, 3)  # few keys: hits, copies and re-caching happen often


class ListPool:
    """vLLM v1 block-pool semantics, one block at a time, on a list free queue."""

    def __init__(self, num_blocks: int) -> None:
        self.free_q = list(range(num_blocks))  # front first
        self.ref = [0] * num_blocks
        self.hash: list[Hashable | None] = [None] * num_blocks
        self.owners: dict[Hashable, list[int]] = {}  # hash -> its blocks, the one hit first
        self.evictions = 0

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self.free_q):
            return None
        blocks = self.free_q[:n]
        del self.free_q[:n]
        for block in blocks:
            old = self.hash[block]
            if old is not None:  # lazy eviction: the hash goes only when the block is reused
                self.hash[block] = None
                self.owners[old].remove(block)
                if not self.owners[old]:
                    del self.owners[old]
                self.evictions += 1
            self.ref[block] = 1
        return blocks

    def acquire_cached(self, keys: list[Hashable]) -> list[int]:
        blocks = []
        for key in keys:
            block = self.owners[key][0]
            if self.ref[block] == 0:
                self.free_q.remove(block)
            self.ref[block] += 1
            blocks.append(block)
        return blocks

    def cache_blocks(self, blocks: list[int], keys: list[Hashable]) -> None:
        for block, key in zip(blocks, keys):
            if self.hash[block] is None:
                self.hash[block] = key
                self.owners.setdefault(key, []).append(block)

    def free(self, blocks: list[int]) -> None:
        front = []
        for block in reversed(blocks):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                if self.hash[block] is None:
                    front.append(block)
                else:
                    self.free_q.append(block)
        self.free_q[:0] = front

    def reset(self) -> None:
        self.owners.clear()
        self.hash = [None] * len(self.hash)

    def count_free_cached(self, keys: list[Hashable]) -> int:
        return sum(self.ref[self.owners[k][0]] == 0 for k in keys)

    def match_prefix(self, keys: list[Hashable], max_blocks: int) -> int:
        n = 0
        while n < min(len(keys), max_blocks) and keys[n] in self.owners:
            n += 1
        return n


class PoolMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 12))
    def setup(self, num_blocks: int) -> None:
        self.pool = GpuBlockPool(num_blocks)
        self.model = ListPool(num_blocks)
        self.held: list[list[int]] = []  # each "request": the blocks it holds
        # the answers a caller keeps while the pool's change counters stand still
        self.matches: dict[tuple[int, ...], tuple[int, int]] = {}  # probe -> (lost_seq, hit)
        self.counts: dict[tuple[int, ...], tuple[int, int]] = {}  # keys -> (held_seq, free)

    @rule(n=st.integers(1, 13), keys=st.lists(KEYS, max_size=13))
    def allocate_and_cache(self, n: int, keys: list[int]) -> None:
        got = self.pool.allocate(n)
        assert got == self.model.allocate(n)
        if got is not None:
            keys = keys[:n]  # the full blocks get keys, the tail may not
            self.pool.cache_blocks(got[: len(keys)], keys)
            self.model.cache_blocks(got[: len(keys)], keys)
            self.held.append(got)

    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        cached = sorted(self.model.owners)
        if not cached:
            return
        keys = data.draw(st.lists(st.sampled_from(cached), min_size=1, max_size=6))
        assert self.pool.count_free_cached(keys) == self.model.count_free_cached(keys)
        got = self.pool.acquire_cached(keys)
        assert got == self.model.acquire_cached(keys)
        self.held.append(got)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), keys=st.lists(KEYS, min_size=1, max_size=13))
    def cache_held(self, data: st.DataObject, keys: list[int]) -> None:
        """A later chunk: a held request's blocks (some already hashed) get keys."""
        blocks = self.held[data.draw(st.integers(0, len(self.held) - 1))]
        self.pool.cache_blocks(blocks, keys)
        self.model.cache_blocks(blocks, keys)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        blocks = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.pool.free(blocks)
        self.model.free(blocks)

    @rule()
    def reset(self) -> None:
        """A prefix-cache reset, with every block back in the queue first."""
        for blocks in self.held:
            self.pool.free(blocks)
            self.model.free(blocks)
        self.held = []
        self.pool.reset()
        self.model.reset()

    @invariant()
    def agrees(self) -> None:
        pool, model = self.pool, self.model
        assert pool.num_free == len(model.free_q)
        assert pool.evictions == model.evictions
        assert pool.num_cached == len(model.owners)
        # the block a hit on each hash would take (the oldest copy still holding it)
        assert pool._cached == {key: blocks[0] for key, blocks in model.owners.items()}
        for start in range(8):
            probe = [(start + i) % 8 for i in range(4)]
            assert pool.match_prefix(probe, 3) == model.match_prefix(probe, 3)

    @invariant()
    def kept_answers_hold(self) -> None:
        """A hit found earlier holds while ``lost_seq`` stands (the match goes on past it), and
        a count of free cached blocks while ``held_seq`` stands: the scheduler keeps them
        for a waiting request that it looks up at every step."""
        pool, model = self.pool, self.model
        for start in range(8):
            probe = tuple((start + i) % 8 for i in range(4))
            seq, known = self.matches.get(probe, (-1, 0))
            if seq != pool.lost_seq:
                known = 0
            hit = pool.match_prefix(probe, 3, known)
            assert hit == model.match_prefix(list(probe), 3)
            self.matches[probe] = (pool.lost_seq, hit)
        cached = sorted(model.owners)
        for keys in (tuple(cached), tuple(cached[::2]), tuple(cached[-2:])):
            seq, free = self.counts.get(keys, (-1, 0))
            if seq == pool.held_seq:
                assert free == model.count_free_cached(list(keys))
            self.counts[keys] = (pool.held_seq, pool.count_free_cached(keys))

    def teardown(self) -> None:
        """Everything back: the whole free queue comes out in the same order."""
        if not hasattr(self, "pool"):
            return
        for blocks in self.held:
            self.pool.free(blocks)
            self.model.free(blocks)
        n = self.pool.num_blocks
        assert self.pool.allocate(n) == self.model.allocate(n)


def test_a_hit_takes_the_oldest_copy_left() -> None:
    """Three requests cache one hash; when the first copy is reused, the second is hit."""
    pool = GpuBlockPool(4)
    first, second, third = (pool.allocate(1) for _ in range(3))
    for blocks in (first, second, third):
        pool.cache_blocks(blocks, [9])
    pool.free(first)  # block 0 goes to the back: the never-used block 3 goes first
    assert pool.allocate(2) == [3, 0]  # block 0 loses its hash: copies 1 and 2 still hold it
    assert pool.acquire_cached([9]) == second
    assert pool.num_cached == 1 and pool.evictions == 1


PoolMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pool_decides_as_the_list_model = PoolMachine.TestCase
