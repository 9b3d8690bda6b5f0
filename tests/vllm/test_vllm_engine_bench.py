"""``kvsim bench --timed`` against vLLM 0.33's own engine-side code: the two runs must make
the same decisions, and a run that differs must be reported as different (not timed as if
it were the same work)."""

from __future__ import annotations

import pytest
from support import SAMPLE, need_vllm

need_vllm("vllm.v1.core.sched.scheduler")
need_vllm("vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector")

from kvsim.engine.bench import (  # noqa: E402
    KV_BYTES_PER_TOKEN,
    TwinKnobs,
    bench_timed,
    decision_difference,
    twin_engine,
)
from kvsim.integrations.vllm_engine import run_vllm_engine  # noqa: E402
from kvsim.traces import Trace, as_trace  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_bench_timed_same_decisions(async_scheduling: bool) -> None:
    tr = as_trace(SAMPLE, limit=25)
    knobs = TwinKnobs(
        block_tokens=tr.block_tokens,
        gpu_blocks=400,
        cpu_chunks=40,
        max_num_batched_tokens=512,
        async_scheduling=async_scheduling,
    )
    table = bench_timed(list(tr), knobs, repeat=1)
    vllm = table.set_index("engine").loc["vllm-0.33"]
    assert vllm["same_decisions"], vllm["difference"]
    assert vllm["steps"] == table.set_index("engine").loc["kvsim", "steps"]
    assert vllm["kvsim_speedup"] > 0


def test_a_different_run_is_reported() -> None:
    """Compared with vLLM's run of other knobs (a smaller GPU), kvsim's run differs, and
    the check names where."""
    tr = as_trace(SAMPLE, limit=25)
    requests = list(tr)
    ours = TwinKnobs(block_tokens=tr.block_tokens, gpu_blocks=400, cpu_chunks=40)
    engine = twin_engine(ours).run(Trace.from_requests(requests, tr.block_tokens))
    theirs = run_vllm_engine(
        requests,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        block_tokens=tr.block_tokens,
        gpu_blocks=400,
        cpu_chunks=40,
        step_s=0.02,  # another forward time: every token lands later
    )
    difference = decision_difference(engine, theirs)
    assert difference is not None and "request" in difference


def test_both_engines_run_best_of_n_alternating(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``repeat=N`` each engine runs N times, kvsim's and vLLM's runs alternating (a
    best of N against a single run would favour kvsim), and the last runs still agree."""
    import kvsim.engine.bench as bench
    import kvsim.integrations.vllm_engine as vllm_engine

    order: list[str] = []
    real_twin, real_vllm = bench.twin_engine, vllm_engine.run_vllm_engine

    def twin(*args, **kwargs):  # type: ignore[no-untyped-def]
        order.append("kvsim")
        return real_twin(*args, **kwargs)

    def theirs(*args, **kwargs):  # type: ignore[no-untyped-def]
        order.append("vllm")
        return real_vllm(*args, **kwargs)

    monkeypatch.setattr(bench, "twin_engine", twin)
    monkeypatch.setattr(vllm_engine, "run_vllm_engine", theirs)
    tr = as_trace(SAMPLE, limit=15)
    knobs = TwinKnobs(block_tokens=tr.block_tokens, gpu_blocks=400, cpu_chunks=40)
    table = bench_timed(list(tr), knobs, repeat=3).set_index("engine")
    assert order == ["kvsim", "vllm"] * 3
    assert table.loc["vllm-0.33", "same_decisions"], table.loc["vllm-0.33", "difference"]
    assert table.loc["vllm-0.33", "kvsim_speedup"] == pytest.approx(
        table.loc["vllm-0.33", "seconds"] / table.loc["kvsim", "seconds"]
    )
