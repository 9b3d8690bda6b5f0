"""Async scheduling (vLLM 0.33's default loop) on small cases computed by hand.

The tiny world of test_engine_helpers: every forward with tokens takes 1 s, 16-token blocks
and chunks, a 16-token chunk crosses the link in ``per_chunk`` seconds. Under async
scheduling ``schedule(N+1)`` runs when batch ``N-1`` is processed, while forward ``N`` still
runs, and forward ``N+1`` starts when forward ``N`` ends.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from support import SAMPLE, expect_overload
from test_engine_helpers import make_engine, req, tables

from kvsim.api import simulate
from kvsim.cli import cli
from kvsim.core.context import RequestContext
from kvsim.engine.params import EngineParams
from kvsim.engine.request_state import SimRequest
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.transfer_protocol import STORE
from kvsim.manager.gpu_cache import GpuBlockPool
from kvsim.traces import Trace

PREFIX = (0, 1, 2)


def run(reqs, *, async_scheduling: bool = True, **kw):
    return make_engine(async_scheduling=async_scheduling, **kw).run(Trace.from_requests(reqs, 16))


def computing_steps(st):
    return st[st.num_seqs > 0].sort_values("step")


def test_lone_request_overlaps_its_next_decode_with_the_forward():
    # step 0 (t=0) prefills, forward 0-1; step 1 is scheduled at t=0 too, before step 0's
    # token exists (an output placeholder), and runs 1-2; step 2 is scheduled when step 0 is
    # processed (t=1) and runs 2-3. Forwards stay back to back, so TTFT and finish are the
    # synchronous loop's; step 3 (t=2) skips the request: its last token is in flight.
    eng = run([req(0, 0, 32, 3, ())], offload=False)
    r, _, st = tables(eng)
    steps = computing_steps(st)
    assert list(steps.start_s) == [0.0, 0.0, 1.0]  # schedule times
    assert list(steps.end_s) == [1.0, 2.0, 3.0]
    assert list(steps.prefill_tokens + steps.decode_tokens) == [32, 1, 1]
    assert (r.loc[0, "first_token_s"], r.loc[0, "finish_s"]) == (1.0, 3.0)
    sync = tables(run([req(0, 0, 32, 3, ())], offload=False, async_scheduling=False))[0]
    assert (sync.loc[0, "first_token_s"], sync.loc[0, "finish_s"]) == (1.0, 3.0)


@pytest.mark.parametrize("output", [1, 2, 5])
def test_no_step_is_scheduled_past_max_tokens(output: int):
    _, _, st = tables(run([req(0, 0, 32, output, ())], offload=False))
    assert len(computing_steps(st)) == output


def test_an_arrival_waits_for_the_step_in_flight():
    # B arrives at 0.5 while forwards 0 (A's prefill, 0-1) and 1 (A's decode, 1-2) are both
    # queued. It is first scheduled when step 0 is processed (t=1), in step 2, whose forward
    # runs 2-3 behind step 1's: TTFT 2.5 s. The synchronous loop schedules it at t=1 in
    # step 1 (forward 1-2): TTFT 1.5 s.
    reqs = [req(0, 0, 32, 4, ()), req(1, 0.5, 32, 1, ())]
    r, _, st = tables(run(reqs, offload=False))
    assert r.loc[1, "ttft_s"] == pytest.approx(2.5)
    assert (r.loc[0, "first_token_s"], r.loc[0, "finish_s"]) == (1.0, 4.0)
    step2 = computing_steps(st).iloc[2]
    assert (step2.start_s, step2.end_s, step2.num_seqs) == (1.0, 3.0, 2)
    sync = tables(run(reqs, offload=False, async_scheduling=False))[0]
    assert sync.loc[1, "ttft_s"] == pytest.approx(1.5)
    assert sync.loc[0, "finish_s"] == 4.0


def test_stores_start_when_the_forward_that_writes_them_ends():
    # Chunked prefill, one 16-token chunk per step. Chunk c is offered by step c and
    # submitted by step c+1's launch, at host time c (async: before forward c has ended),
    # so it starts when forward c ends (c+1) and takes 0.25 s. Synchronously it is submitted
    # at c+1 (test_engine_connector).
    eng = run([req(0, 0, 48, 2, PREFIX)], budget=16)
    r, tr, st = tables(eng)
    stores = tr[tr.direction == STORE].sort_values("job")
    assert list(stores.created_step) == [0, 1, 2]
    assert list(stores.submit_s) == [0.0, 1.0, 2.0]
    assert list(stores.start_s) == [1.0, 2.0, 3.0]
    assert list(stores.end_s) == [1.25, 2.25, 3.25]
    assert list(computing_steps(st).start_s) == [0.0, 0.0, 1.0, 2.0]
    assert (r.loc[0, "first_token_s"], r.loc[0, "finish_s"]) == (3.0, 4.0)


def _request(rid: int, prompt: int) -> SimRequest:
    return SimRequest(rid, 0.0, prompt, 4, [], [], RequestContext(rid))


def test_blocks_freed_while_their_step_is_in_flight_return_after_it_is_processed():
    # vLLM defer_block_free (async + a KV-consumer connector): a request scheduled in a step
    # still in flight keeps its blocks out of the pool until that step is processed.
    params = EngineParams(gpu_blocks=8, enable_prefix_caching=False, async_scheduling=True)
    s = Scheduler(params, GpuBlockPool(8), 16, None)
    s.defer_free = True  # what a connector turns on
    a = _request(0, 32)
    s.waiting.append(a)
    s.schedule(0.0, 0)
    assert (a.in_flight, a.placeholders, a.last_seq, s.pool.num_free) == (32, 1, 1, 6)
    s.running.remove(a)
    s._preempt(a)  # preempted while step 0 (its prefill) is in flight
    assert a.stale == 32 and a.in_flight == 0 and a.placeholders == 0
    assert s.pool.num_free == 6  # deferred
    s.begin_update(computed=True)  # step 0 processed: the fence is passed
    assert s.pool.num_free == 8
    s.update(1.0, [(a, 32, True)])  # its stale token still lands, computing nothing
    assert (a.num_output, a.num_computed, a.stale) == (1, 0, 0)


@expect_overload
def test_async_scheduling_is_the_default_and_can_be_turned_off():
    on = simulate(SAMPLE, limit=10, record_steps=False)
    off = simulate(SAMPLE, limit=10, record_steps=False, async_scheduling=False)
    assert on.config["async_scheduling"] is True and off.config["async_scheduling"] is False
    assert on.summary["completed"] == off.summary["completed"] == 10
    res = CliRunner().invoke(
        cli, ["simulate", SAMPLE, "--limit", "5", "--no-async-scheduling", "--json"]
    )
    assert res.exit_code == 0, res.output
