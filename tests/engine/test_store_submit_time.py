"""The forward waits for the host time of the stores submitted before it.

vLLM 0.33's ``handle_preemptions`` submits the previous step's stores on the worker thread
(descriptor arrays, one ``cuMemcpyBatchAsync`` per job: the link's ``per_copy_s`` per
descriptor) before that thread launches the forward. World: tests/engine/test_engine_helpers.py
(1 s forwards, llama-3.1-8b: 32 layers, so a 3-block store is 96 descriptors).
"""

from __future__ import annotations

import pytest
from test_engine_helpers import CHUNK_BYTES, make_engine, req, tables

from kvsim.engine.transfer_model import DirectionParams, TransferModelParams
from kvsim.traces import Trace

DESCRIPTORS = 3 * 32  # a 48-token prompt: 3 blocks x 32 layers


def _engine(per_copy_s: float, offload: bool = True, **kw):
    eng = make_engine(offload=offload, **kw)
    d2h = DirectionParams(0.0, per_copy_s, ((1.0, CHUNK_BYTES / 0.25 / 1e9),))
    h2d = DirectionParams(0.0, 0.0, ((1.0, CHUNK_BYTES / 0.25 / 1e9),))
    eng.backend.params = TransferModelParams("test", h2d, d2h, duplex_factor=1.0)
    return eng


def _run(per_copy_s: float, offload: bool = True, **kw):
    # R0 computes a fresh 48-token prompt at step 0; R1 (another prompt) arrives at t=1 and
    # shares step 1 with R0's second token, the step that submits R0's store
    reqs = [req(0, 0, 48, 2, (0, 1, 2)), req(1, 1, 48, 1, (3, 4, 5))]
    eng = _engine(per_copy_s, offload, **kw)
    return eng.run(Trace.from_requests(reqs, 16))


@pytest.mark.parametrize("per_copy_s", [0.0, 0.01])
def test_step_after_a_store_starts_after_its_host_time(per_copy_s):
    eng = _run(per_copy_s)
    r, _, st = tables(eng)
    host = DESCRIPTORS * per_copy_s  # 0.96 s with 10 ms per descriptor
    step1 = st[st.step == 1].iloc[0]
    assert step1.stores_submitted == 1
    assert step1.stall_s == pytest.approx(host)
    assert step1.start_s == pytest.approx(1.0)  # the schedule; the forward ends 1 s after
    assert step1.end_s == pytest.approx(2.0 + host)
    # R1's prompt (96 descriptors as well) is stored by the step after
    assert eng.connector.submit_host_time == pytest.approx(2 * host)
    # R1 (queued behind the submission) and R0's second token pay it; without the term
    # (per_copy_s = 0) the run equals one without a CPU tier
    assert r.loc[1, "first_token_s"] == pytest.approx(2.0 + host)
    assert r.loc[0, "finish_s"] == pytest.approx(2.0 + host)


def test_without_host_time_the_tail_equals_no_offload():
    off, _, _ = tables(_run(0.0, offload=False))
    for per_copy_s in (0.0, 0.01):
        on, _, _ = tables(_run(per_copy_s))
        ttft_on = on.first_token_s - on.arrival_s
        ttft_off = off.first_token_s - off.arrival_s
        # the worst TTFT (R1's): ratio 1 without the term, (1 + 0.96) / 1 with it
        assert ttft_on.max() / ttft_off.max() == pytest.approx(1 + DESCRIPTORS * per_copy_s)


@pytest.mark.parametrize(("per_copy_s", "delay"), [(0.01, 0.0), (0.02, 0.92)])
def test_async_loop_hides_host_time_behind_the_forward_in_flight(per_copy_s, delay):
    # vLLM 0.33's batch queue: step 1 is scheduled and submits R0's store at t=0, while
    # step 0's forward (0-1 s) runs; its forward starts at max(1.0, host end)
    eng = _run(per_copy_s, async_scheduling=True)
    _, _, st = tables(eng)
    step1 = st[st.step == 1].iloc[0]
    assert step1.stores_submitted == 1
    assert step1.end_s == pytest.approx(2.0 + delay)
