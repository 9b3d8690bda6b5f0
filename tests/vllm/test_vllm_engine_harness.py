"""Tests of tests/vllm_engine_harness.py: vLLM 0.33's own Scheduler + KVCacheManager +
OffloadingConnector driven on CPU under the shared time model. Each test checks something
about the harness that could be wrong (times, hits, loads, preemption, rejection, both loop
modes). Skipped without vLLM (failed under ``KVSIM_REQUIRE_VLLM=1``)."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from support import need_vllm

need_vllm("vllm.v1.core.sched.scheduler")
need_vllm("vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector")

from vllm_engine_harness import VllmRun, run_vllm_engine  # noqa: E402

from kvsim.traces.model import Request  # noqa: E402

pytestmark = pytest.mark.vllm

STEP_S = 0.01
PER_TOKEN_S = 1e-4
BT = 64  # trace block tokens
GBT = 16  # vLLM GPU block tokens
KV = 1000  # bytes per token: a GPU block page is 16 kB
MODES = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def run(reqs: list[Request], **kw) -> VllmRun:
    kw.setdefault("block_tokens", BT)
    kw.setdefault("gpu_block_tokens", GBT)
    kw.setdefault("step_s", STEP_S)
    kw.setdefault("per_token_s", PER_TOKEN_S)
    kw.setdefault("kv_bytes_per_token", KV)
    out = run_vllm_engine(reqs, **kw)
    assert out.complete
    return out


def fwd(tokens: int) -> float:
    return STEP_S + PER_TOKEN_S * tokens


def check_finished(out: VllmRun) -> None:
    for r in out.requests.values():
        if not r.rejected:
            assert r.generated_tokens == r.output_tokens, r
            assert r.finish_step >= r.first_token_step >= r.admitted_step >= 0, r


@MODES
def test_lone_request_first_token_at_end_of_its_prefill_step(async_scheduling: bool) -> None:
    out = run(
        [Request(0, 0.5, 300, 4, (1, 2, 3, 4))],
        gpu_blocks=100,
        max_num_batched_tokens=128,  # chunked prefill: 128 + 128 + 44
        max_num_seqs=16,  # vLLM requires max_num_batched_tokens >= max_num_seqs
        async_scheduling=async_scheduling,
    )
    r = out.requests[0]
    assert r.first_token_step == 2
    # arrivals count from the first one (issue 27 item 5): the request arrives at 0
    assert r.first_token_s == pytest.approx(3 * STEP_S + 300 * PER_TOKEN_S)
    assert r.finish_s == pytest.approx(r.first_token_s + 3 * fwd(1))
    assert [s.scheduled for s in out.executed_steps()] == [{0: 128}, {0: 128}, {0: 44}] + [
        {0: 1}
    ] * 3
    ex = out.executed_steps()
    assert ex[0].sampled == ex[1].sampled == () and ex[2].sampled == (0,)
    # one GPU stream: forwards back to back while the request runs
    assert all(b.start_s == pytest.approx(a.end_s) for a, b in pairwise(ex))
    assert (r.gpu_hit_tokens, r.cpu_hit_tokens) == (0, 0)


def test_loop_modes_build_vllms_scheduler_classes_and_overlap_scheduling() -> None:
    reqs = [Request(0, 0.0, 100, 5, (1,))]
    sync = run(reqs, gpu_blocks=50)
    asy = run(reqs, gpu_blocks=50, async_scheduling=True)
    assert (sync.scheduler_class, sync.batch_queue_size) == ("Scheduler", 1)
    assert (asy.scheduler_class, asy.batch_queue_size) == ("AsyncScheduler", 2)
    # sync: each schedule() waits for the previous forward; async: it runs while it is on
    se, ae = sync.executed_steps(), asy.executed_steps()
    assert all(b.schedule_s == pytest.approx(a.end_s) for a, b in pairwise(se))
    assert ae[1].schedule_s < ae[0].end_s
    assert all(b.schedule_s < a.end_s for a, b in pairwise(ae))
    # same token times under both loops when nothing else interferes
    assert asy.requests[0].first_token_s == pytest.approx(sync.requests[0].first_token_s)
    assert asy.requests[0].finish_s == pytest.approx(sync.requests[0].finish_s)


@MODES
def test_shared_prefix_gets_gpu_hit_tokens(async_scheduling: bool) -> None:
    reqs = [
        Request(0, 0.0, 200, 2, (1, 2, 3)),
        Request(1, 1.0, 200, 2, (1, 2, 9)),  # shares two trace blocks
        Request(2, 2.0, 200, 2, (7, 8, 9)),  # shares nothing (ids are prefix-chained)
        Request(3, 3.0, 128, 2, (1, 2)),  # whole prompt cached: vLLM keeps one token back
    ]
    out = run(reqs, gpu_blocks=100, async_scheduling=async_scheduling)
    hits = {i: (r.gpu_hit_tokens, r.cpu_hit_tokens) for i, r in out.requests.items()}
    assert hits == {0: (0, 0), 1: (128, 0), 2: (0, 0), 3: (112, 0)}
    first = {i: out.steps[r.first_token_step] for i, r in out.requests.items()}
    assert first[1].scheduled == {1: 72}
    assert first[3].scheduled == {3: 16}
    assert out.requests[1].first_token_s == pytest.approx(1.0 + fwd(72))
    check_finished(out)


def _cpu_hit_trace() -> list[Request]:
    return [
        Request(0, 0.0, 256, 2, (1, 2, 3, 4)),  # stored to the CPU tier
        Request(1, 1.0, 400, 2, (11, 12, 13, 14, 15, 16)),  # evicts it from the GPU
        Request(2, 2.0, 32, 30, (21,)),  # decodes while request 3 loads
        Request(3, 2.05, 272, 2, (1, 2, 3, 4, 5)),  # CPU hit on request 0's prefix
    ]


@MODES
def test_cpu_hit_is_loaded_after_the_forward_and_delays_the_first_token(
    async_scheduling: bool,
) -> None:
    h2d = 5e6
    out = run(
        _cpu_hit_trace(),
        gpu_blocks=28,
        cpu_chunks=32,
        h2d_bytes_per_s=h2d,
        d2h_bytes_per_s=5e6,
        async_scheduling=async_scheduling,
    )
    check_finished(out)
    r = out.requests[3]
    assert r.cpu_hit_tokens > 0
    assert r.gpu_hit_tokens + r.cpu_hit_tokens == 256  # the whole shared prefix
    assert r.cpu_hit_tokens % BT == 0  # whole offloaded chunks (gpu hit is 0 here)
    (load,) = [t for t in out.transfers.values() if t.kind == "load"]
    assert load.request_id == 3
    assert load.created_step == load.submit_step == r.admitted_step
    assert load.blocks * GBT == r.cpu_hit_tokens
    assert load.nbytes == load.blocks * GBT * KV
    adm = out.steps[r.admitted_step]
    assert 3 not in adm.scheduled and adm.num_tokens > 0  # request 2 decodes in it
    assert load.start_s == pytest.approx(adm.end_s)  # after that step's forward
    assert load.end_s - load.start_s == pytest.approx(load.nbytes / h2d)
    # reported by the first poll (a schedule() host time) at or after its end
    rep = out.steps[load.reported_step]
    assert rep.schedule_s >= load.end_s
    assert out.steps[load.reported_step - 1].schedule_s < load.end_s
    assert rep.finished_recving == (3,)
    # scheduled at the first schedule() after the update_from_output carrying it
    first = min(s.index for s in out.steps if 3 in s.scheduled)
    assert out.steps[first].schedule_s >= rep.processed_s
    assert all(s.schedule_s < rep.processed_s for s in out.steps[load.reported_step : first])
    assert out.steps[first].scheduled[3] == 272 - 256
    assert r.first_token_step == first
    assert r.first_token_s == pytest.approx(out.steps[first].end_s)
    assert r.first_token_s > load.end_s + STEP_S
    # the offered chunks of requests 0 and 1 were stored after their prefill forward
    stores = sorted(
        (t for t in out.transfers.values() if t.kind == "store"), key=lambda t: t.job_id
    )
    assert [t.request_id for t in stores] == [0, 1]
    for t in stores:
        assert t.submit_step == t.created_step + 1
        assert t.start_s >= out.steps[t.created_step].end_s
    # without the CPU tier the same request recomputes its prefix
    plain = run(_cpu_hit_trace(), gpu_blocks=28, async_scheduling=async_scheduling)
    assert plain.requests[3].cpu_hit_tokens == 0 and not plain.transfers
    assert plain.requests[3].gpu_hit_tokens == r.gpu_hit_tokens


@MODES
def test_whole_prompt_cpu_hit_loads_everything_and_recomputes_one_token(
    async_scheduling: bool,
) -> None:
    reqs = [
        *_cpu_hit_trace()[:2],
        Request(2, 2.0, 256, 2, (1, 2, 3, 4)),  # request 0's prompt again, idle engine
        Request(3, 3.0, 256, 2, (1, 2, 3, 4)),  # and again, now GPU-resident
    ]
    h2d = 5e6
    out = run(
        reqs,
        gpu_blocks=28,
        cpu_chunks=32,
        h2d_bytes_per_s=h2d,
        d2h_bytes_per_s=5e6,
        async_scheduling=async_scheduling,
    )
    check_finished(out)
    r2, r3 = out.requests[2], out.requests[3]
    # the connector may hit up to num_tokens (the GPU prefix cache stops at num_tokens - 1)
    assert r2.cpu_hit_tokens > 0 and r2.gpu_hit_tokens + r2.cpu_hit_tokens == 256
    assert (r3.gpu_hit_tokens, r3.cpu_hit_tokens) == (240, 0)  # < one chunk left: no load
    (load,) = [t for t in out.transfers.values() if t.kind == "load"]
    first = out.steps[r2.first_token_step]
    assert first.scheduled == {2: 1}  # the last prompt token is recomputed
    # engine idle: the load starts at the arrival, is polled at its end, then one forward
    assert load.start_s == pytest.approx(2.0)
    assert r2.first_token_s == pytest.approx(2.0 + load.nbytes / h2d + fwd(1))
    assert out.steps[r3.first_token_step].scheduled == {3: 16}


def test_store_threshold_two_skips_the_first_offer() -> None:
    reqs = [Request(0, 0.0, 256, 2, (1, 2, 3, 4)), Request(1, 1.0, 300, 2, (1, 2, 3, 4, 5))]
    base = dict(gpu_blocks=100, cpu_chunks=32)
    once = run(reqs, **base)
    twice = run(reqs, store_threshold=2, **base)
    assert [t.request_id for t in once.transfers.values()] == [0]
    # threshold 2: request 0's offer only counts; request 1 re-offers its GPU-hit prefix
    assert [(t.request_id, t.blocks) for t in twice.transfers.values()] == [(1, 16)]
    assert twice.requests[1].gpu_hit_tokens == 256


@MODES
def test_tiny_gpu_cache_preempts_and_every_request_still_finishes(async_scheduling: bool) -> None:
    reqs = [Request(i, 0.001 * i, 96, 60, (100 + i,)) for i in range(6)]
    out = run(reqs, gpu_blocks=24, async_scheduling=async_scheduling)
    check_finished(out)
    preempted = [r for s in out.steps for r in s.preempted]
    assert preempted
    assert sum(r.preemptions for r in out.requests.values()) == len(preempted)
    # a victim resumes later (from the GPU prefix cache where its blocks survived) and
    # preemption costs recomputation: more than prompt + output - 1 tokens in all
    for victim in preempted:
        k = next(s.index for s in out.steps if victim in s.preempted)
        assert any(victim in s.scheduled for s in out.steps[k + 1 :])
    total = {i: sum(s.scheduled.get(i, 0) for s in out.steps) for i in out.requests}
    assert all(total[i] >= 96 + 60 - 1 for i in total)
    assert any(total[i] > 96 + 60 - 1 for i in preempted)


@MODES
def test_over_long_request_is_rejected_and_never_scheduled(async_scheduling: bool) -> None:
    reqs = [
        Request(0, 0.0, 150, 11, (1, 2)),  # 161 > max_model_len 160
        Request(1, 0.0, 150, 10, (1, 2)),  # exactly 160: fits
        Request(2, 0.0, 160, 1, ()),  # prompt alone fills it
    ]
    # 11 blocks: vLLM's null block and ten usable, 160 tokens
    out = run(reqs, gpu_blocks=11, async_scheduling=async_scheduling)
    assert out.max_model_len == 160
    assert [out.requests[i].rejected for i in range(3)] == [True, False, True]
    assert all(0 not in s.scheduled and 2 not in s.scheduled for s in out.steps)
    assert out.requests[0].first_token_step == -1
    check_finished(out)


def random_trace(seed: int, n: int = 40) -> list[Request]:
    """Conversations sharing prefixes (prefix-chained ids), Poisson arrivals."""
    rng = random.Random(seed)
    convs: list[tuple[int, ...]] = []
    reqs: list[Request] = []
    t = 0.0
    next_id = 1
    for i in range(n):
        t += rng.expovariate(20.0)
        if convs and rng.random() < 0.6:
            prev = rng.choice(convs)
            base = prev[: rng.randint(1, len(prev))]
        else:
            base = ()
        extra = rng.randint(1, 4)
        ids = base + tuple(range(next_id, next_id + extra))
        next_id += extra
        convs.append(ids)
        tail = rng.randint(0, BT - 1)
        reqs.append(Request(i, t, len(ids) * BT + tail, rng.randint(1, 40), ids))
    return reqs


@pytest.mark.parametrize(
    ("async_scheduling", "policy", "chunk_tokens"),
    [(False, "lru", BT), (True, "arc", BT), (False, "arc", 2 * BT), (True, "lru", 2 * BT)],
    ids=["sync-lru", "async-arc", "sync-arc-2blocks", "async-lru-2blocks"],
)
def test_random_trace_reaches_preemption_async_loads_and_stores(
    async_scheduling: bool, policy: str, chunk_tokens: int
) -> None:
    out = run(
        random_trace(7, 200),
        gpu_blocks=64,
        cpu_chunks=24 * BT // chunk_tokens,
        chunk_tokens=chunk_tokens,
        policy=policy,
        max_num_batched_tokens=256,
        max_num_seqs=64,
        h2d_bytes_per_s=2e7,
        d2h_bytes_per_s=1e7,
        async_scheduling=async_scheduling,
    )
    check_finished(out)
    kinds = {t.kind for t in out.transfers.values()}
    assert kinds == {"load", "store"}
    assert any(s.preempted for s in out.steps)
    assert any(s.stall_s > 0 for s in out.steps)  # a flushed store was still running
    assert all(s.flushed_jobs for s in out.steps if s.stall_s > 0)
    assert any(r.cpu_hit_tokens for r in out.requests.values())
    assert any(r.gpu_hit_tokens for r in out.requests.values())
    assert all(t.reported_step >= 0 for t in out.transfers.values())  # all jobs completed
    for t in out.transfers.values():
        assert t.start_s >= t.submit_s and t.end_s - t.start_s == pytest.approx(
            t.nbytes / (2e7 if t.kind == "load" else 1e7)
        )
    for kind in ("load", "store"):  # one FIFO per direction
        jobs = sorted(
            (t for t in out.transfers.values() if t.kind == kind), key=lambda t: t.start_s
        )
        assert all(b.start_s >= a.end_s - 1e-12 for a, b in pairwise(jobs))
