"""A closed loop of clients on kvsim's engine is the closed loop on vLLM's: the sends kvsim's
client made (each at the finish of the request it replaces) are replayed through vLLM 0.33's
own engine code (tests/vllm_engine_harness.py, the shared trivial time model), which must
finish every request when kvsim did. Then vLLM's finishes would have triggered the same
sends: the two closed loops are the same run. Times are binary fractions, so a send at a
finish is exactly at it on both sides. Skipped without vLLM."""

from __future__ import annotations

import math
from typing import Any

import pytest
from support import need_vllm

need_vllm("vllm.v1.core.sched.scheduler")
need_vllm("vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector")

from vllm_engine_harness import run_vllm_engine  # noqa: E402

from kvsim.engine.bench import KV_BYTES_PER_TOKEN, TwinKnobs, twin_engine  # noqa: E402
from kvsim.traces import Request  # noqa: E402
from kvsim.workloads import build_workload  # noqa: E402

pytestmark = pytest.mark.vllm

SHARED = {
    "type": "shared_prefix",
    "num_groups": 3,
    "num_prompts_per_group": 4,
    "system_prompt_len": 100,
    "question_len": 60,
    "output_len": 20,
}
RANDOM = {"type": "random", "input_len": 300, "output_len": 24, "range_ratio": 0.8}
RANDOM |= {"prefix_len": 90}
LOAD = {
    "type": "concurrency",
    "stages": [{"concurrency": 3, "num_requests": 20}, {"concurrency": 8, "duration": 1.5}],
}
CONFIGS = {
    "roomy": {"gpu_blocks": 400},
    "offload": {"gpu_blocks": 48, "cpu_chunks": 40, "max_num_batched_tokens": 256},
}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("workload", [SHARED, RANDOM], ids=["shared_prefix", "random"])
def test_closed_loop_matches_vllm(workload: dict[str, Any], config: str, async_scheduling: bool):
    knobs: dict[str, Any] = {
        "block_tokens": 16,
        # binary fractions: every time is exact on both sides, so a send at a finish is at
        # the finish on vLLM's side too (decimal steps would differ by ulps: 0.1 + 0.2)
        "step_s": 2.0**-7,
        "per_token_s": 2.0**-16,
        "h2d_bytes_per_s": 2.0**31,
        "d2h_bytes_per_s": 2.0**30,
        "async_scheduling": async_scheduling,
        **CONFIGS[config],
    }
    src = build_workload(workload, LOAD, seed=2, block_size=16).source()
    sent: list[Request] = []
    ask = src.next_arrival

    def recording(now: float):  # type: ignore[no-untyped-def]
        nxt = ask(now)
        if nxt is not None and nxt[1] is not None:
            sent.append(nxt[1])
        return nxt

    src.next_arrival = recording  # type: ignore[method-assign]
    engine = twin_engine(TwinKnobs(**knobs)).run(src)
    table = engine.recorder.request_table().set_index("request")
    assert len(sent) > 25 and src.done
    if config == "offload":  # the small GPU preempts; the CPU tier serves the shared prompts
        assert table.preemptions.sum() > 0
        assert table.cpu_hit_tokens.sum() > 0 or workload is RANDOM
    vllm = run_vllm_engine(sent, kv_bytes_per_token=KV_BYTES_PER_TOKEN, **knobs)
    assert vllm.complete
    for rid, v in vllm.requests.items():
        k = table.loc[rid]
        assert (v.gpu_hit_tokens, v.cpu_hit_tokens) == (k.gpu_hit_tokens, k.cpu_hit_tokens), rid
        for name in ("first_token_s", "finish_s"):
            assert math.isclose(getattr(v, name), k[name], abs_tol=1e-9), (rid, name)
    # the clients' count is never exceeded on vLLM's timeline
    caps = [3, 8]
    for r in sent:
        arrival = vllm.requests[r.request_id].arrival_s
        before = [q for q in sent[: r.request_id] if vllm.requests[q.request_id].finish_s > arrival]
        assert len(before) < caps[src.stage_of[r.request_id]]
