"""``kvsim bench --timed``: timed mode's speed against vLLM 0.33's own engine-side code.

Both sides run the same requests under the shared trivial time model of the engine
differential tests (a forward takes ``step_s + per_token_s x tokens``, a copy ``bytes /
rate``): kvsim's :class:`~kvsim.engine.engine.Engine` and vLLM's ``Scheduler`` +
``KVCacheManager`` + ``OffloadingConnector`` driven on CPU with a trivial forward
(:mod:`kvsim.integrations.vllm_engine`, the way simulators that reuse the engine's own code
run). Their decisions are checked against each other (each request's hits, preemptions,
first-token and finish times, and the number of computing steps), so the ratio compares
two runs that did the same thing. Ratios are measured in one process on the same
in-memory requests, each engine's time the best of N runs, the two engines' runs
alternating: a best of N set against a single run would favour the engine with more
draws, and a machine whose speed drifts would favour whichever ran in its fast spell.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import pandas as pd

from kvsim.engine.compute_model import LinearCompute
from kvsim.engine.engine import Engine
from kvsim.engine.params import EngineParams
from kvsim.engine.request_state import REJECTED
from kvsim.engine.transfer_model import constant_link
from kvsim.options.offload import CacheConfig
from kvsim.report.progress import Progress, ProgressArg
from kvsim.specs.hardware import get_gpu
from kvsim.specs.models import get_model
from kvsim.traces import Request, Trace, as_trace

MODEL = "llama-3.1-8b"
KV_BYTES_PER_TOKEN = get_model(MODEL).kv_bytes_per_token()  # what both sides move per token
_T = TypeVar("_T")


@dataclass(frozen=True)
class TwinKnobs:
    """The knobs both engines take (``tests/engine_twin.py`` and the differential tests use
    the same ones). ``cpu_chunks=None``: no offloading."""

    block_tokens: int
    gpu_blocks: int
    gpu_block_tokens: int = 16
    chunk_tokens: int | None = None
    cpu_chunks: int | None = None
    policy: str = "lru"
    store_threshold: int = 0
    step_s: float = 0.01
    per_token_s: float = 1e-5
    h2d_bytes_per_s: float = 25e9
    d2h_bytes_per_s: float = 25e9
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    async_scheduling: bool = False
    enable_chunked_prefill: bool = True


def twin_engine(knobs: TwinKnobs, *, record_steps: bool = True) -> Engine:
    """kvsim's engine with ``knobs``, on the shared trivial time model."""
    config = CacheConfig(
        num_chunks=knobs.cpu_chunks or 1,
        block_tokens=knobs.block_tokens,
        chunk_tokens=knobs.chunk_tokens or knobs.block_tokens,
        policy=knobs.policy,
        store_threshold=knobs.store_threshold,
        model=MODEL,
    )
    params = EngineParams(
        gpu_blocks=knobs.gpu_blocks,
        gpu_block_tokens=knobs.gpu_block_tokens,
        max_num_batched_tokens=knobs.max_num_batched_tokens,
        max_num_seqs=knobs.max_num_seqs,
        long_prefill_token_threshold=knobs.long_prefill_token_threshold,
        async_scheduling=knobs.async_scheduling,
        enable_chunked_prefill=knobs.enable_chunked_prefill,
        record_steps=record_steps,
    )
    link = constant_link(
        {
            "kind": "constant",
            "h2d_bytes_per_s": knobs.h2d_bytes_per_s,
            "d2h_bytes_per_s": knobs.d2h_bytes_per_s,
        }
    )
    return Engine(
        config,
        params,
        model=get_model(MODEL),
        gpu=get_gpu("h200"),
        compute=LinearCompute(knobs.step_s, knobs.per_token_s),
        transfer=link,
        offload=knobs.cpu_chunks is not None,
    )


def decision_difference(engine: Engine, vllm_run: Any) -> str | None:
    """The first difference between kvsim's run and vLLM's (a ``VllmRun``): a request's
    rejection, GPU / CPU hit tokens, preemptions, first-token or finish time, or the number
    of steps that computed tokens. None when they made the same decisions."""
    rows = {r.rid: r for r in engine.recorder.requests}
    for rid, want in sorted(vllm_run.requests.items()):
        got = rows[rid]
        rejected = got.status == REJECTED
        if want.rejected != rejected:
            return f"request {rid}: rejected {want.rejected} (vLLM) vs {rejected} (kvsim)"
        if rejected:
            continue
        ours = (got.gpu_hit, got.cpu_hit, got.preemptions)
        theirs = (want.gpu_hit_tokens, want.cpu_hit_tokens, want.preemptions)
        if ours != theirs:
            return f"request {rid}: (GPU hit, CPU hit, preemptions) {theirs} (vLLM) vs {ours}"
        for name, value in (("first_token_s", got.first_token), ("finish_s", got.finish)):
            if value is None or not math.isclose(
                getattr(want, name), value, rel_tol=1e-9, abs_tol=1e-9
            ):
                return f"request {rid}: {name} {getattr(want, name)} (vLLM) vs {value}"
    computing = len(vllm_run.executed_steps())
    if computing != engine.computing_steps:
        return f"{computing} computing steps in vLLM, {engine.computing_steps} in kvsim"
    return None


def bench_timed(
    requests: Sequence[Request],
    knobs: TwinKnobs,
    *,
    repeat: int = 3,
    with_vllm: bool = True,
    progress: ProgressArg = None,
) -> pd.DataFrame:
    """One row per engine: seconds (the best of ``repeat`` runs, kvsim's and vLLM's runs
    alternating), steps, steps/s, requests/s and ``kvsim_speedup`` (how many times faster
    kvsim is), plus ``same_decisions`` and, when they differ, the first ``difference``
    (of the last runs; both engines are deterministic). kvsim runs as ``kvsim simulate``
    without ``--out`` (no steps table). ``progress`` counts the runs, between them (a bar:
    True; :class:`~kvsim.report.progress.Progress`)."""
    trace = Trace.from_requests(list(requests), knobs.block_tokens)
    if with_vllm:
        from kvsim.integrations.vllm_engine import run_vllm_engine

    best = best_vllm = math.inf
    engine: Engine | None = None
    vllm_run: Any = None
    runs = repeat * (2 if with_vllm else 1)
    with Progress(progress, runs, "bench --timed", unit="run") as done:
        for _ in range(repeat):
            seconds, engine = _cpu_seconds(
                lambda: twin_engine(knobs, record_steps=False).run(trace)
            )
            best = min(best, seconds)
            done(1)
            if with_vllm:
                seconds, vllm_run = _cpu_seconds(
                    lambda: run_vllm_engine(
                        requests,
                        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                        max_steps=10**9,
                        **asdict(knobs),
                    )
                )
                best_vllm = min(best_vllm, seconds)
                done(1)
    assert engine is not None
    rows: list[dict[str, Any]] = [_row("kvsim", best, engine.steps, len(requests))]
    if with_vllm:
        difference = decision_difference(engine, vllm_run)
        row = _row("vllm-0.33", best_vllm, len(vllm_run.steps), len(requests))
        row.update(
            kvsim_speedup=best_vllm / best,
            same_decisions=difference is None,
            difference=difference or "",
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _cpu_seconds(run: Callable[[], _T]) -> tuple[float, _T]:
    """CPU seconds of one ``run()`` (after a collection, so that no earlier run's garbage
    is collected on its time), and what it returned."""
    gc.collect()
    start = time.process_time()
    out = run()
    return time.process_time() - start, out


def _row(engine: str, seconds: float, steps: int, requests: int) -> dict[str, Any]:
    return {
        "engine": engine,
        "seconds": seconds,
        "steps": steps,
        "steps_per_s": steps / seconds if seconds else math.inf,
        "requests_per_s": requests / seconds if seconds else math.inf,
    }


def bench_trace(
    trace: str,
    limit: int,
    gpu_blocks: int,
    cpu_chunks: int,
    policy: str,
    repeat: int,
    with_vllm: bool,
    progress: ProgressArg = None,
) -> tuple[str, pd.DataFrame]:
    """``kvsim bench --timed``: the first ``limit`` requests of ``trace`` on both engines
    (async scheduling, vLLM's default); a header line and :func:`bench_timed`'s table."""
    tr = as_trace(trace, limit=limit)
    requests = list(tr)
    knobs = TwinKnobs(
        block_tokens=tr.block_tokens,
        gpu_blocks=gpu_blocks,
        cpu_chunks=cpu_chunks,
        policy=policy,
        async_scheduling=True,
    )
    table = bench_timed(requests, knobs, repeat=repeat, with_vllm=with_vllm, progress=progress)
    head = (
        f"trace {trace}: {len(requests):,} requests, {gpu_blocks:,} GPU blocks, "
        f"{cpu_chunks:,} CPU chunks, policy {policy} (CPU seconds)"
    )
    return head, table
