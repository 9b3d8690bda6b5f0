"""The timed engine's shortcuts on its hot paths decide exactly what the long way would.

* the running loop offers stores only for requests that may have completed a chunk: every
  scheduled request it leaves out would have offered nothing;
* GPU prefix-cache keys are made a unit at a time as ints: a block is shared exactly when
  its trace unit is, and keys made piecemeal equal keys made at once;
* the connector's fence keeps a plain job id for a block one store reads, a set for more.
"""

from __future__ import annotations

import random

import pytest
from test_engine_helpers import make_engine

from kvsim.core.context import RequestContext
from kvsim.engine.connector import ConnectorJob, OffloadConnector
from kvsim.engine.engine import Engine
from kvsim.engine.params import EngineParams
from kvsim.engine.request_state import SimRequest
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.transfer_protocol import STORE
from kvsim.manager.gpu_cache import GpuBlockPool
from kvsim.manager.offload import OffloadManager
from kvsim.options.offload import CacheConfig
from kvsim.traces import Request, Trace


def _workload(seed: int) -> list[Request]:
    """Requests that share prompt prefixes, with decodes long enough to fill chunks."""
    rng = random.Random(seed)
    reqs = []
    for i in range(40):
        n_units = rng.randint(1, 6)
        base = rng.randrange(4) * 100  # four families of shared prefixes
        hashes = tuple(base + u for u in range(n_units))
        prompt = 16 * n_units + rng.randint(0, 15)
        reqs.append(Request(i, i * 0.3, prompt, rng.randint(1, 40), hashes))
    return reqs


def _check_left_out_offers(engine: Engine, counts: dict[str, int]) -> None:
    """Wrap the connector's store offers: first offer, the long way, every scheduled request
    the scheduler left out, and require that nothing happens (no job, no failure, no move)."""
    conn, sched = engine.connector, engine.scheduler
    assert conn is not None
    build = conn.build_store_jobs

    def checked(offers: list[SimRequest]) -> None:
        chosen = {id(r) for r in offers}
        for r in sched.scheduled:
            if id(r) in chosen:
                continue
            before = (r.next_store, len(conn.store_next), conn.allocation_failures, len(conn.jobs))
            conn._offer(r, r.num_computed + r.in_flight)
            after = (r.next_store, len(conn.store_next), conn.allocation_failures, len(conn.jobs))
            assert after == before, f"request {r.rid} had chunks to offer"
            counts["left_out"] += 1
        counts["offered"] += len(offers)
        build(offers)

    conn.build_store_jobs = checked  # type: ignore[method-assign]


@pytest.mark.parametrize("prompt_only", [True, False])
@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize(("seed", "budget"), [(1, 64), (2, 16)])  # 16: a chunk a step
def test_requests_left_out_of_store_offers_had_nothing_to_offer(
    prompt_only: bool, async_scheduling: bool, seed: int, budget: int
) -> None:
    engine = make_engine(
        cpu_chunks=30,  # small: some offers fail and are retried
        gpu_blocks=40,  # small: preemptions and prefix evictions
        prefix=True,
        budget=budget,
        offload_prompt_only=prompt_only,
        async_scheduling=async_scheduling,
    )
    counts = {"left_out": 0, "offered": 0}
    _check_left_out_offers(engine, counts)
    engine.run(Trace.from_requests(_workload(seed), 16))
    assert engine.scheduler.num_preemptions > 0
    assert counts["left_out"] > 0 and counts["offered"] > 0  # both sides were exercised


def _request(rid: int, units: list[int], prompt: int) -> SimRequest:
    return SimRequest(rid, 0.0, prompt, 4, list(units), list(units), RequestContext(rid))


def test_block_keys_are_shared_exactly_with_their_unit() -> None:
    # 64-token trace units, 16-token GPU blocks: 4 blocks a unit
    s = Scheduler(EngineParams(gpu_blocks=64), GpuBlockPool(64), 64, None)
    a = _request(0, [10, 11, 12], 200)  # 3 units = 12 shared blocks, then its own
    b = _request(1, [10, 99, 12], 200)
    ka, kb = s._block_keys(a, 14), s._block_keys(b, 14)
    assert ka[:4] == kb[:4]  # unit 10 at the head of both
    assert all(x != y for x, y in zip(ka[4:8], kb[4:8]))  # 11 vs 99
    assert ka[8:12] == kb[8:12]  # unit 12, same place
    assert all(x != y for x, y in zip(ka[12:], kb[12:]))  # past the units: each request's own
    assert len(set(ka)) == len(set(kb)) == 14
    c = _request(0, [10, 11, 12], 200)
    for n in (1, 3, 3, 6, 13, 14):  # made piecemeal, across unit boundaries
        s._block_keys(c, n)
    assert c.block_keys == ka
    single = Scheduler(EngineParams(gpu_blocks=64), GpuBlockPool(64), 16, None)
    assert single._block_keys(_request(2, [10, 11], 40), 2) == [10, 11]  # one block a unit


def test_a_block_fenced_by_two_stores_waits_for_both() -> None:
    """The fence keeps one job id per block until a second store reads it (then a set)."""
    config = CacheConfig(num_chunks=10, block_tokens=16, chunk_tokens=16)
    manager = OffloadManager.from_config(config)
    conn = OffloadConnector(manager, config.layout, kv_bytes_per_token=1, num_layers=1)
    owner = _request(0, [], 16)

    def job(job_id: int, blocks: list[int]) -> ConnectorJob:
        return ConnectorJob(job_id, STORE, owner, [], blocks, [], 0, 1, 0)

    first, second = job(1, [5, 6]), job(2, [6, 7])
    conn._fence(first)
    conn._fence(second)
    conn.on_allocate([6])  # block 6 is read by both stores: both must be flushed
    assert conn.flush == {1, 2}
    conn.flush = set()
    conn.on_allocate([9, 5])
    assert conn.flush == {1} and conn.allocated_now == {5, 6, 9}
    conn._unfence(first)
    assert conn.fence == {6: {2}, 7: 2}
    conn._unfence(second)
    assert conn.fence == {}
