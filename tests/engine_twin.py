"""kvsim's timed engine under the shared trivial time model, recorded the way
``tests/vllm_engine_harness.py`` records vLLM's own engine, so the two runs can be compared
step by step (tests/vllm/test_vllm_engine_differential.py).

Both sides get the same requests and the same knobs: GPU blocks of ``gpu_block_tokens``,
a CPU tier of ``cpu_chunks`` chunks of ``chunk_tokens``, a forward of ``step_s + per_token_s
x tokens`` and a link of constant rates, FIFO per direction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import kvsim.engine.quiet_loop as quiet_loop
from kvsim.engine.bench import KV_BYTES_PER_TOKEN, TwinKnobs, twin_engine
from kvsim.engine.engine import Engine
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.step_batch import StepBatch
from kvsim.engine.transfer_protocol import STORE
from kvsim.traces import Request, Trace

__all__ = ["KV_BYTES_PER_TOKEN", "TwinRun", "run_kvsim_engine", "transfer_rows"]


@dataclass
class TwinStep:
    """One ``schedule()`` of kvsim's scheduler."""

    schedule_s: float
    scheduled: dict[int, int]
    preempted: tuple[int, ...]


@dataclass
class TwinRun:
    steps: list[TwinStep] = field(default_factory=list)
    engine: Engine | None = None
    quiet_steps: int = 0  # of ``steps``, scheduled by the quiet decode path
    decode_run_steps: int = 0  # of those, scheduled in runs at once (advance_decoders)
    quiet_waiting_steps: int = 0  # of those, with requests waiting (none admitted)
    quiet_copying_steps: int = 0  # of those, with copies in flight

    def executed_steps(self) -> list[TwinStep]:
        return [s for s in self.steps if s.scheduled]


def run_kvsim_engine(
    requests: Sequence[Request],
    *,
    block_tokens: int,
    gpu_blocks: int,
    gpu_block_tokens: int = 16,
    chunk_tokens: int | None = None,
    cpu_chunks: int | None = None,
    policy: str = "lru",
    store_threshold: int = 0,
    step_s: float = 0.01,
    per_token_s: float = 1e-5,
    h2d_bytes_per_s: float = 25e9,
    d2h_bytes_per_s: float = 25e9,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    long_prefill_token_threshold: int = 0,
    async_scheduling: bool = False,
    enable_chunked_prefill: bool = True,
) -> TwinRun:
    """Run ``requests`` through kvsim's Engine with the harness's knobs, recording each step."""
    knobs = TwinKnobs(
        block_tokens=block_tokens,
        gpu_blocks=gpu_blocks,
        gpu_block_tokens=gpu_block_tokens,
        chunk_tokens=chunk_tokens,
        cpu_chunks=cpu_chunks,
        policy=policy,
        store_threshold=store_threshold,
        step_s=step_s,
        per_token_s=per_token_s,
        h2d_bytes_per_s=h2d_bytes_per_s,
        d2h_bytes_per_s=d2h_bytes_per_s,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        long_prefill_token_threshold=long_prefill_token_threshold,
        async_scheduling=async_scheduling,
        enable_chunked_prefill=enable_chunked_prefill,
    )
    engine = twin_engine(knobs)
    run = TwinRun(engine=engine)
    scheduler = engine.scheduler
    schedule = scheduler.schedule

    def recorded(now: float, step: int):  # type: ignore[no-untyped-def]
        batch = schedule(now, step)
        run.steps.append(
            TwinStep(
                now,
                {r.rid: r.sched for r in scheduler.scheduled},
                tuple(r.rid for r in scheduler.preempted),
            )
        )
        return batch

    schedule_quiet = quiet_loop.schedule_quiet

    def count_quiet(sched: Scheduler, steps: int) -> None:
        run.quiet_steps += steps
        run.quiet_waiting_steps += steps * bool(sched.waiting)
        run.quiet_copying_steps += steps * bool(engine.connector and engine.connector.jobs)

    def recorded_quiet(sched: Scheduler) -> StepBatch:
        batch = schedule_quiet(sched)
        count_quiet(sched, 1)
        run.steps.append(
            TwinStep(engine.clock.now(), {r.rid: r.sched for r in sched.scheduled}, ())
        )
        return batch

    advance_decoders = quiet_loop.advance_decoders

    def recorded_run(sched: Scheduler, starts: Sequence[float], ends: Sequence[float]) -> None:
        advance_decoders(sched, starts, ends)
        scheduled = {r.rid: r.sched for r in sched.scheduled}  # the same in every step
        count_quiet(sched, len(starts))
        run.decode_run_steps += len(starts)
        run.steps.extend(TwinStep(t, scheduled, ()) for t in starts)

    scheduler.schedule = recorded  # type: ignore[method-assign]
    # the engine's quiet decode iterations schedule without Scheduler.schedule, one at a
    # time or a run of them at once
    quiet_loop.schedule_quiet = recorded_quiet
    quiet_loop.advance_decoders = recorded_run
    try:
        engine.run(Trace.from_requests(list(requests), block_tokens))
    finally:
        quiet_loop.schedule_quiet = schedule_quiet
        quiet_loop.advance_decoders = advance_decoders
    return run


def transfer_rows(run: TwinRun, gpu_block_tokens: int) -> list[tuple[str, int, int, float, float]]:
    """(kind, request, GPU blocks, start, end) of every finished job, in job order."""
    assert run.engine is not None
    table = run.engine.recorder.transfer_table().sort_values("job")
    per_block = gpu_block_tokens * KV_BYTES_PER_TOKEN
    return [
        (
            "store" if r.direction == STORE else "load",
            int(r.request),
            int(r.bytes) // per_block,
            float(r.start_s),
            float(r.end_s),
        )
        for r in table.itertuples()
    ]
