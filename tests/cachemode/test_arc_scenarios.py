"""Hand-computed ARC scenarios whose ghost ratios are not integers (semantics doc §3.3).

Why: the fused tier (``kvsim.cachemode.fused_arc``) and the protocol's ``ARCPolicy`` share
``kvsim.policies.arc``'s helpers, so the fused-vs-protocol test cannot see a fault in
them (``len(b2) // len(b1)`` for ``/`` passed the whole suite). Here every request's
victims, CPU hits, target ``p`` and lists T1, T2, B1, B2 are worked out by hand, and
checked through the manager API, through cache-mode replay (fused and protocol tiers)
and, when it is importable, against vLLM 0.33's own manager.

Each request runs as cache-mode replay runs it, alone: load its leading resident chunks,
offer the rest in one store, finish. Capacity 10 chunks; one 16-token block per chunk,
and the block ids are the chunk keys (not prefix-chained: the CPU tier does not need it,
the GPU cache is off). Lists are written LRU first. At a finish, tail first, a key the
request only stored moves to its list's MRU end and a key it loaded moves to T2's MRU end.
An eviction takes T1's LRU while the virtual |T1| (|T1| minus this call's T1 picks) is at
least int(p), else T2's LRU; victims join their ghost list's MRU end; each ghost list is
capped at 10. A ghost hit on a store miss adds max(1, |B2|/|B1|) to p for B1 (cap 10)
and subtracts max(1, |B1|/|B2|) for B2 (floor 0); the ghost leaves when the key is stored.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from support import need_vllm

from kvsim.cachemode import CacheReplay
from kvsim.cachemode.fused_arc import FusedARCTier
from kvsim.core.context import chunk_positions
from kvsim.manager.offload import OffloadManager
from kvsim.options.offload import OffloadOptions
from kvsim.policies.arc import ARCPolicy
from kvsim.traces import Request

BLOCK = 16
CAPACITY = 10


class Step(NamedTuple):
    blocks: list[int]
    hits: int  # leading blocks loaded from the CPU tier
    evicted: list[int]  # in pick order
    p: float
    t1: list[int]
    t2: list[int]
    b1: list[int]
    b2: list[int]


def ids(first: int, last: int) -> list[int]:
    return list(range(first, last + 1))


# p grows by |B2|/|B1| = 5/2 twice: 2.5, then 5.0 (``//`` would give 2, then 4).
# fmt: off
GROW = [
    # store 1..5; finish reverses them: T1 = [5,4,3,2,1]
    Step([1, 2, 3, 4, 5], hits=0, evicted=[], p=0.0,
         t1=[5, 4, 3, 2, 1], t2=[],
         b1=[], b2=[]),
    # load 1..5; finish promotes tail first: T2 = [5,4,3,2,1]
    Step([1, 2, 3, 4, 5], hits=5, evicted=[], p=0.0,
         t1=[], t2=[5, 4, 3, 2, 1],
         b1=[], b2=[]),
    # store 10 keys, 5 free: T1 is empty, so T2's LRU goes 5 times: B2 = [5,4,3,2,1]
    Step(ids(11, 20), hits=0, evicted=[5, 4, 3, 2, 1], p=0.0,
         t1=ids(11, 20)[::-1], t2=[],
         b1=[], b2=[5, 4, 3, 2, 1]),
    # full; p = 0 so T1's LRU: 20, 19 -> B1 = [20,19]
    Step([21, 22], hits=0, evicted=[20, 19], p=0.0,
         t1=[18, 17, 16, 15, 14, 13, 12, 11, 22, 21], t2=[],
         b1=[20, 19], b2=[5, 4, 3, 2, 1]),
    # load 11..13: T2 = [13,12,11]
    Step([11, 12, 13], hits=3, evicted=[], p=0.0,
         t1=[18, 17, 16, 15, 14, 22, 21], t2=[13, 12, 11],
         b1=[20, 19], b2=[5, 4, 3, 2, 1]),
    # B1 hit: p = 0 + 5/2 = 2.5, B1 = [19,20]; vt1 7 >= 2: evict T1's 18, B1 = [19,20,18];
    # storing 20 drops its ghost: B1 = [19,18]
    Step([20], hits=0, evicted=[18], p=2.5,
         t1=[17, 16, 15, 14, 22, 21, 20], t2=[13, 12, 11],
         b1=[19, 18], b2=[5, 4, 3, 2, 1]),
    # B1 hit: p = 2.5 + 5/2 = 5.0; evict T1's 17 (vt1 7 >= 5); B1 = [18,17]
    Step([19], hits=0, evicted=[17], p=5.0,
         t1=[16, 15, 14, 22, 21, 20, 19], t2=[13, 12, 11],
         b1=[18, 17], b2=[5, 4, 3, 2, 1]),
    # 4 new keys, need 4, int(p) = 5: T1 at vt1 7, 6, 5 (16, 15, 14), then vt1 4 < 5: T2's 13.
    # (With p = 4 the fourth victim would be T1's 22.)
    Step([31, 32, 33, 34], hits=0, evicted=[16, 15, 14, 13], p=5.0,
         t1=[22, 21, 20, 19, 34, 33, 32, 31], t2=[12, 11],
         b1=[18, 17, 16, 15, 14], b2=[5, 4, 3, 2, 1, 13]),
    # 13 is a ghost, not a hit. B2 hit: p = 5 - max(1, 5/6) = 4.0; vt1 8 >= 4: T1's 22
    Step([13], hits=0, evicted=[22], p=4.0,
         t1=[21, 20, 19, 34, 33, 32, 31, 13], t2=[12, 11],
         b1=[18, 17, 16, 15, 14, 22], b2=[5, 4, 3, 2, 1]),
]
# fmt: on

# p rises to 5 by five B1 hits of max(1, 2/5) = 1, then falls by |B1|/|B2| = 5/2 to 2.5
# (``//`` would give 3).
# fmt: off
SHRINK = [
    Step([1, 2], hits=0, evicted=[], p=0.0,
         t1=[2, 1], t2=[],
         b1=[], b2=[]),
    Step([1, 2], hits=2, evicted=[], p=0.0,
         t1=[], t2=[2, 1],
         b1=[], b2=[]),
    # 10 keys, 8 free: T1 is empty, T2's LRU goes twice: B2 = [2,1]
    Step(ids(11, 20), hits=0, evicted=[2, 1], p=0.0,
         t1=ids(11, 20)[::-1], t2=[],
         b1=[], b2=[2, 1]),
    # p = 0: T1's LRU 5 times
    Step(ids(21, 25), hits=0, evicted=[20, 19, 18, 17, 16], p=0.0,
         t1=[15, 14, 13, 12, 11, 25, 24, 23, 22, 21], t2=[],
         b1=[20, 19, 18, 17, 16], b2=[2, 1]),
    # five B1 hits, tail (20) first, each +1: p = 5.0, and the ghosts move to B1's MRU end in
    # that order (B1 = [20,19,18,17,16] again). Need 5: vt1 10..6 >= 5, T1's 15..11 go;
    # storing 16..20 drops their ghosts: B1 = [15,14,13,12,11]
    Step(ids(16, 20), hits=0, evicted=[15, 14, 13, 12, 11], p=5.0,
         t1=[25, 24, 23, 22, 21, 20, 19, 18, 17, 16], t2=[],
         b1=[15, 14, 13, 12, 11], b2=[2, 1]),
    # load 21..23: T2 = [23,22,21]
    Step([21, 22, 23], hits=3, evicted=[], p=5.0,
         t1=[25, 24, 20, 19, 18, 17, 16], t2=[23, 22, 21],
         b1=[15, 14, 13, 12, 11], b2=[2, 1]),
    # B2 hit: p = 5 - 5/2 = 2.5; vt1 7 >= 2: T1's 25 -> B1; storing 1 drops its ghost
    Step([1], hits=0, evicted=[25], p=2.5,
         t1=[24, 20, 19, 18, 17, 16, 1], t2=[23, 22, 21],
         b1=[15, 14, 13, 12, 11, 25], b2=[2]),
    # 6 new keys, int(p) = 2: T1 at vt1 7..2 (24, 20, 19, 18, 17, 16). B1 grows to 12 and
    # loses its 2 LRU ghosts (15, 14). (With p = 3 the sixth victim would be T2's 23.)
    Step(ids(41, 46), hits=0, evicted=[24, 20, 19, 18, 17, 16], p=2.5,
         t1=[1, 46, 45, 44, 43, 42, 41], t2=[23, 22, 21],
         b1=[13, 12, 11, 25, 24, 20, 19, 18, 17, 16], b2=[2]),
    # 23 is still resident: a hit, and its reuse moves it to T2's MRU end
    Step([23], hits=1, evicted=[], p=2.5,
         t1=[1, 46, 45, 44, 43, 42, 41], t2=[22, 21, 23],
         b1=[13, 12, 11, 25, 24, 20, 19, 18, 17, 16], b2=[2]),
]
# fmt: on

SCENARIOS = {"grow": GROW, "shrink": SHRINK}


def serve(m, name: str, blocks: list[int]) -> tuple[int, list[int]]:
    """One request through the manager API alone; returns (CPU hits, victims)."""
    ctx = m.new_context(name, chunk_positions(blocks, BLOCK))
    m.on_new_request(ctx)
    hits, _ = m.lookup_prefix(blocks)
    if hits:
        m.prepare_load(blocks[:hits], ctx)
        m.complete_load(blocks[:hits], ctx)
    victims: list[int] = []
    if hits < len(blocks):
        out = m.prepare_store(blocks[hits:], ctx)
        assert out is not None, f"{name}: store failed"
        m.complete_store(out.keys_to_store, ctx)
        victims = list(out.evicted_keys)
    m.on_request_finished(ctx)
    return hits, victims


def lists(arc) -> tuple:
    """``p`` and the four lists of kvsim's ARCPolicy or fused tier."""
    return arc.p, list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2)


def expected(step: Step) -> tuple:
    return step.p, step.t1, step.t2, step.b1, step.b2


@pytest.mark.parametrize("name", SCENARIOS)
def test_manager(name: str) -> None:
    m = OffloadManager(CAPACITY, ARCPolicy(CAPACITY))
    for i, step in enumerate(SCENARIOS[name]):
        assert serve(m, f"r{i}", step.blocks) == (step.hits, step.evicted), (name, i)
        assert lists(m.policy) == expected(step), (name, i)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "protocol"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_cache_mode_replay(name: str, fused: bool) -> None:
    cfg = OffloadOptions(cpu_chunks=CAPACITY, model=None, policy="arc", chunk_tokens=BLOCK)
    run = CacheReplay(cfg.resolve(BLOCK), fused=fused)
    assert isinstance(run.tier, FusedARCTier) == fused
    arc = run.tier if fused else run.manager.policy
    for i, step in enumerate(SCENARIOS[name]):
        before = set(run.tier.resident_keys())
        rows: list[tuple] = []
        run.run(
            [Request(i, float(i), BLOCK * len(step.blocks), 1, tuple(step.blocks))], rows.append
        )
        (row,) = rows
        stored = len(step.blocks) - step.hits
        assert row[5:8] == (step.hits, stored, len(step.evicted)), (name, i)
        assert before - set(run.tier.resident_keys()) == set(step.evicted), (name, i)
        assert lists(arc) == expected(step), (name, i)


@pytest.mark.vllm
@pytest.mark.parametrize("name", SCENARIOS)
def test_vllm_agrees(name: str) -> None:
    """The hand computations are vLLM's (its policy's lists are read from its internals)."""
    need_vllm("vllm.v1.kv_offload.cpu.manager")
    from kvsim.integrations.from_vllm import VllmManagerDriver

    m = VllmManagerDriver(CAPACITY, "arc")
    policy = m.inner._policy

    def keys(entries) -> list[int]:
        return [int.from_bytes(k[:8], "big") for k in entries]

    for i, step in enumerate(SCENARIOS[name]):
        assert serve(m, f"r{i}", step.blocks) == (step.hits, step.evicted), (name, i)
        got = (policy.target_t1_size, *map(keys, (policy.t1, policy.t2, policy.b1, policy.b2)))
        assert got == expected(step), (name, i)
