"""``Recorder.token_times`` sums the requests with as many tokens as each other as the rows
of one array: every time must be exactly what the request's own sum gives (the peaks vLLM
reports count tokens per whole second, so one float apart can move a token across a
second), and no request may be lost or counted twice, across batches too."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

import kvsim.engine.recorder as recorder
from kvsim.core.context import RequestContext
from kvsim.engine.recorder import Recorder
from kvsim.engine.request_state import SimRequest


def _requests(seed: int) -> list[SimRequest]:
    """Requests with 0 to 6 gaps (so lengths repeat), random gaps and first tokens, some
    without a first token (never counted)."""
    rng = np.random.default_rng(seed)
    out = []
    for rid in range(60):
        req = SimRequest(rid, 0.0, 10, 7, [], [], RequestContext(rid))
        if rng.random() < 0.9:
            req.first_token = float(rng.uniform(0, 1e4))
            req.token_gaps = array("f", rng.exponential(0.03, rng.integers(0, 7)).tolist())
        out.append(req)
    return out


def _own_sum(req: SimRequest) -> np.ndarray:
    """One request's times as ``recorder._times`` gives them (the plain definition)."""
    assert req.first_token is not None
    return recorder._times(req.token_gaps, req.first_token)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("batch", [1 << 20, 5])
def test_batched_times_are_each_requests_own_bit_for_bit(seed, batch, monkeypatch) -> None:
    monkeypatch.setattr(recorder, "TIMES_BATCH", batch)  # 5: a length's rows cross batches
    rec = Recorder()
    rec.requests = _requests(seed)
    got = np.sort(np.concatenate(list(rec.token_times())))
    timed = [r for r in rec.requests if r.first_token is not None]
    want = np.sort(np.concatenate([_own_sum(r) for r in timed]))
    assert got.tobytes() == want.tobytes()  # the same floats, bit for bit, none lost
    assert len(got) == sum(len(r.token_gaps) + 1 for r in timed)
    chosen = rec.requests[::3]
    got = np.sort(np.concatenate(list(rec.token_times(chosen))))
    want = np.sort(np.concatenate([_own_sum(r) for r in chosen if r.first_token is not None]))
    assert got.tobytes() == want.tobytes()


def test_no_timed_request_gives_no_batch() -> None:
    rec = Recorder()
    rec.requests = [SimRequest(0, 0.0, 10, 7, [], [], RequestContext(0))]
    assert list(rec.token_times()) == []
