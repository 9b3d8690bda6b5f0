"""Scenario tests: each connector timing rule of vLLM 0.33 (semantics doc §5), step by step.

World (tests/engine/test_engine_helpers.py): 16-token blocks = chunks, a forward with
tokens takes 1 s, one 2 MiB chunk crosses the link in 0.25 s (2.5 s for the slow link), GPU
prefix cache off unless a test turns it on.
"""

from __future__ import annotations

import pytest
from test_engine_helpers import make_engine, req, run, tables

from kvsim.engine.transfer_protocol import LOAD, STORE
from kvsim.traces import Trace

PREFIX = (0, 1, 2)  # a 48-token prompt = 3 chunks


def seed_request():
    return req(0, 0, 48, 2, PREFIX)


def test_async_load_waits_a_step_is_submitted_then_polled():
    eng = run([seed_request(), req(1, 5, 48, 2, PREFIX)])
    r, tr, st = tables(eng)
    # R0: prefill at step 0 offers its 3 chunks; the copy is submitted at the next step (t=1).
    store = tr[tr.direction == STORE].iloc[0]
    assert (store.created_step, store.submit_s, store.start_s, store.end_s) == (
        0,
        1.0,
        1.0,
        pytest.approx(1.75),
    )
    # R1 at t=5: whole-prompt CPU hit -> async load submitted after that step's (empty)
    # forward launch (t=5), 0 tokens scheduled; the completion (5.75) is seen by the poll
    # after the launch of the step at 5.75, the request is promoted at the following
    # schedule, and only the last token is recomputed.
    load = tr[tr.direction == LOAD].iloc[0]
    assert (load.request, load.chunks, load.submit_s, load.end_s) == (
        1,
        3,
        5.0,
        pytest.approx(5.75),
    )
    # vLLM reports the whole 48-token prompt as the CPU hit, then recomputes its last token
    assert r.loc[1, "cpu_hit_tokens"] == 48 and r.loc[1, "gpu_hit_tokens"] == 0
    assert r.loc[1, "computed_prompt_tokens"] == 1
    assert r.loc[1, "first_scheduled_s"] == pytest.approx(5.75)
    assert r.loc[1, "first_token_s"] == pytest.approx(6.75)
    assert r.loc[1, "kv_wait_s"] == pytest.approx(0.75)
    after = st[st.start_s >= 5]
    assert list(after.num_seqs[:4]) == [0, 0, 0, 1]  # load step, idle, poll at 5.75, promoted
    assert list(after.loads_submitted[:4]) == [1, 0, 0, 0]
    assert list(after.start_s[:4]) == pytest.approx([5.0, 5.0, 5.75, 5.75])
    # CHUNK_LEVEL: loaded chunks are not offered again.
    assert len(tr[(tr.direction == STORE) & (tr.request == 1)]) == 0


def test_pending_write_defers_lookup():
    # R1 arrives at t=1, the same time as step 1 (arrivals before steps): R0's chunks are
    # still being written (HIT_PENDING), so R1 is deferred. The store ends at 1.75, during
    # step 1's forward: the poll after step 1's launch (t=1) misses it, step 2 (t=2)
    # schedules before its own poll sees it (a second deferral), and step 3 loads.
    eng = run([seed_request(), req(1, 1, 48, 2, PREFIX)])
    r, tr, _ = tables(eng)
    assert r.loc[1, "deferrals"] == 2
    load = tr[tr.direction == LOAD].iloc[0]
    assert (load.created_step, load.submit_s, load.end_s) == (3, 2.0, pytest.approx(2.75))
    assert r.loc[1, "kv_wait_s"] == pytest.approx(1.75)
    assert r.loc[1, "first_token_s"] == pytest.approx(3.75)


def test_chunks_being_loaded_by_another_request_defer():
    eng = run([seed_request(), req(1, 5, 48, 2, PREFIX), req(2, 5, 48, 2, PREFIX)])
    r, tr, _ = tables(eng)
    loads = tr[tr.direction == LOAD].sort_values("job")
    assert list(loads.request) == [1, 2]
    assert r.loc[1, "deferrals"] == 0 and r.loc[2, "deferrals"] >= 1
    # R2 looks up again after R1's load completed (5.75) and loads on its own then: its
    # load is submitted after the launch of the step that runs R1's prefill (5.75-6.75)
    # and, like vLLM's, waits for that forward to end before it starts.
    assert loads.iloc[1].submit_s == pytest.approx(5.75)
    assert loads.iloc[1].start_s == pytest.approx(6.75)
    assert loads.iloc[1].end_s == pytest.approx(7.5)


def test_stores_offered_when_scheduled_and_submitted_next_step():
    eng = run([req(0, 0, 48, 2, PREFIX)], budget=16)  # chunked prefill: one chunk per step
    _, tr, st = tables(eng)
    stores = tr[tr.direction == STORE].sort_values("job")
    assert list(stores.created_step) == [0, 1, 2]
    assert list(stores.submit_s) == [1.0, 2.0, 3.0]
    assert list(stores.chunks) == [1, 1, 1]
    assert list(st.prefill_tokens[:3]) == [16, 16, 16]


def test_failed_offer_retried_next_step_and_final_chunk_stored_after_finish():
    # CPU tier of 2 chunks, 2 s per chunk: chunk 2 cannot be placed while chunks 0 and 1
    # are still being written. It fails at steps 2 and 3; R0 finishes at step 3 (t=4); the
    # finished-request offer at step 4 succeeds because chunk 0's write completed at 3.0,
    # seen by the poll after step 3's launch (t=3).
    eng = make_engine(cpu_chunks=2, per_chunk=2.0, budget=16)
    calls = []
    manager = eng.manager
    original = manager.on_request_finished

    def spy(ctx):
        calls.append((ctx.req_id, eng.connector.step))
        original(ctx)

    manager.on_request_finished = spy
    eng.run(Trace.from_requests([req(0, 0, 48, 2, PREFIX)], 16))
    r, tr, st = tables(eng)
    stores = tr[tr.direction == STORE].sort_values("job")
    assert list(stores.created_step) == [0, 1, 4]
    assert r.loc[0, "finish_s"] == 4.0
    assert list(st.allocation_failures_total[:5]) == [0, 0, 1, 2, 2]
    last = stores.iloc[2]
    assert (last.submit_s, last.start_s, last.end_s) == (
        4.0,
        pytest.approx(5.0),
        pytest.approx(7.0),
    )
    assert eng.manager.counters.evicted_chunks == 1
    assert calls == [(0, 4)]  # on_request_finished in the step after the finish


def test_gpu_hit_chunks_reoffered_when_nothing_loaded():
    # store_threshold 2: R0's first offer is only counted. R1 gets a 2-block GPU prefix hit
    # (never the whole prompt), finds no CPU hit beyond it, so next_store stays 0 and its
    # first step offers all 3 chunks, GPU-hit ones included: the second offer stores them.
    eng = run([seed_request(), req(1, 5, 48, 2, PREFIX)], prefix=True, store_threshold=2)
    r, tr, _ = tables(eng)
    assert r.loc[1, "gpu_hit_tokens"] == 32 and r.loc[1, "cpu_hit_tokens"] == 0
    stores = tr[tr.direction == STORE]
    assert list(stores.request) == [1] and list(stores.chunks) == [3]
    assert stores.iloc[0].created_step == 3  # R1's first step (R0 used steps 0-2)
    assert eng.manager.counters.stores_skipped == 3


def test_decode_chunks_stored_only_without_prompt_only():
    reqs = [req(0, 0, 16, 20, (7,))]  # 35 tokens with KV: chunk 1 (tokens 16-31) is decode
    prompt_only = run(reqs)
    everything = run(reqs, offload_prompt_only=False)
    assert tables(prompt_only)[1].chunks.sum() == 1
    tr = tables(everything)[1]
    assert tr.chunks.sum() == 2
    assert sorted(tr.created_step) == [0, 16]  # decode step that schedules token 31


def test_reusing_a_block_with_a_store_in_flight_stalls_the_forward():
    # 3 GPU blocks. R0 (2 blocks) finishes at t=1; its 2-chunk store is submitted at t=1
    # and takes 5 s. R1 needs all 3 blocks at step 1: reusing R0's blocks forces a flush,
    # so the forward waits until t=6.
    eng = run(
        [req(0, 0, 32, 1, (0, 1)), req(1, 1, 47, 1, (10, 11, 12))], gpu_blocks=3, per_chunk=2.5
    )
    r, tr, st = tables(eng)
    s1 = st[st.step == 1].iloc[0]
    assert s1.stall_s == pytest.approx(5.0)
    assert s1.end_s == pytest.approx(7.0)
    assert r.loc[1, "first_token_s"] == pytest.approx(7.0)
    assert tr[tr.request == 0].end_s.iloc[0] == pytest.approx(6.0)


def test_preemption_flushes_stores_and_waits_for_its_whole_sequence():
    # 5 GPU blocks, two requests that grow into each other's space: the later one is
    # preempted, its in-flight stores are flushed, and it still finishes. With vLLM's
    # full-prompt gate it is readmitted only when its whole sequence (33 tokens: 3 blocks)
    # fits, i.e. after request 0 finished; its own blocks are still in the GPU prefix
    # cache then, so nothing is recomputed.
    eng = run([req(0, 0, 32, 40, (0, 1)), req(1, 0, 32, 40, (5, 6))], gpu_blocks=5, per_chunk=2.5)
    r, _, st = tables(eng)
    assert list(r.preemptions) == [0, 1]
    assert r.recomputed_tokens.sum() == 0
    assert r.finish_s.notna().all() and list(r.output_tokens) == [40, 40]
    assert st.stall_s.sum() > 0
    resumed = st[(st.running == 1) & (st.waiting == 0)].start_s.min()
    assert resumed >= r.loc[0, "finish_s"]


def test_sync_load_runs_in_the_same_step_on_the_expedited_queue():
    eng = run([seed_request(), req(1, 5, 64, 2, (*PREFIX, 3))], sync_load_budget_bytes=10 * 2**21)
    r, tr, st = tables(eng)
    exp = tr[tr.direction == "expedited"]
    assert len(exp) == 1 and exp.iloc[0].submit_s == 5.0
    assert r.loc[1, "first_scheduled_s"] == 5.0
    assert r.loc[1, "cpu_hit_tokens"] == 48
    assert st[st.start_s == 5.0].stall_s.iloc[0] == pytest.approx(0.75)
    assert r.loc[1, "first_token_s"] == pytest.approx(6.75)
