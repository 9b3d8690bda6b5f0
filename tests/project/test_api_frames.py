"""The top-level API returns pandas objects and takes them back as traces."""

from __future__ import annotations

import pandas as pd
import pytest
from support import SAMPLE

import kvsim
from kvsim.traces import open_trace


def test_generate_returns_a_frame_that_replays_like_its_requests():
    frame = kvsim.generate("chat", n_requests=60, seed=3)
    assert isinstance(frame, pd.DataFrame) and len(frame) == 60
    assert frame.attrs["block_tokens"] == 512
    from kvsim.traces.synthetic import generate as generate_requests

    requests = generate_requests("chat", n_requests=60, seed=3)
    a = kvsim.replay(frame, cpu_chunks=64)
    b = kvsim.replay(requests, cpu_chunks=64, block_tokens=512)
    assert a.summary["cpu_hit_blocks"] == b.summary["cpu_hit_blocks"] > 0
    assert a.requests.equals(b.requests)


def test_requests_frame_round_trip_of_a_file_trace():
    trace = open_trace(SAMPLE, limit=30)
    frame = kvsim.requests_frame(trace, trace.block_tokens)
    assert list(frame["prompt_tokens"]) == [r.prompt_tokens for r in trace]
    a = kvsim.replay(frame, cpu_chunks=50).requests
    b = kvsim.replay(SAMPLE, limit=30, cpu_chunks=50).requests
    assert a.equals(b)


def test_a_frame_without_the_request_columns_is_rejected():
    with pytest.raises(kvsim.InputError, match="block_hashes"):
        kvsim.replay(
            pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [10], "output_tokens": [1]}),
            cpu_chunks=4,
        )


def test_summary_frame_lists_every_summary_metric_in_order():
    res = kvsim.replay(SAMPLE, limit=20, cpu_chunks=50)
    frame = res.summary_frame()
    assert list(frame["metric"]) == list(res.summary)
    assert frame.set_index("metric").loc["requests", "value"] == 20
