"""The engine's quiet iterations: :func:`quiet_run`, the async loop while it is quiet, and
:func:`decode_run`, a run of such iterations stepped at once (the scheduler's part of both
is :mod:`kvsim.engine.quiet_decode`).

They are the engine's own loop, kept beside it (``engine.py`` holds the general one) and
called by ``Engine._iterate_async`` when ``engine.QUIET_DECODE`` is on; they drive the
engine's step state (its batch queue, GPU stream, step counters and rows) as its general
step does, and ``tests/engine/test_engine_quiet_decode.py`` holds them to it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal, Protocol

from kvsim.engine.clock import Clock
from kvsim.engine.connector import ConnectorJob, OffloadConnector
from kvsim.engine.events import EventKey, step_due_before
from kvsim.engine.launched import Launched
from kvsim.engine.quiet_decode import (
    DecodeRunBlocks,
    advance_decoders,
    decode_step_seconds,
    quiet_batch,
    quiet_decode_ready,
    schedule_quiet,
    steady_decode_steps,
    update_quiet,
)
from kvsim.engine.recorder import Recorder
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.step_batch import StepBatch
from kvsim.engine.tier_driver import TierDriver
from kvsim.engine.transfer_protocol import TransferBackend, TransferResult
from kvsim.manager.gpu_cache import GpuBlockPool

Poll = Callable[[float], list[TransferResult]]  # the backend's poll at a launch


class Engine(Protocol):
    """What the quiet loop reads and moves of ``kvsim.engine.engine.Engine`` (which it is
    typed against here, so that the two modules do not import each other): its parts, its
    step counters and GPU stream, its batch queue, and the three step methods it shares
    with the general path."""

    steps: int
    computing_steps: int
    busy_s: float
    _compute_tail: float
    _arrived: bool

    @property
    def clock(self) -> Clock: ...
    @property
    def compute(self) -> Callable[[StepBatch], float]: ...
    @property
    def backend(self) -> TransferBackend: ...
    @property
    def connector(self) -> OffloadConnector | None: ...
    @property
    def tiers(self) -> TierDriver | None: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def pool(self) -> GpuBlockPool: ...
    @property
    def recorder(self) -> Recorder: ...
    @property
    def _batches(self) -> deque[Launched]: ...

    def _queue_forward(self, t: float, batch: StepBatch) -> tuple[float, float]: ...
    def _schedule_step(self, t: float) -> None: ...
    def _record_step(
        self,
        step: int,
        t0: float,
        t2: float,
        stall: float,
        fwd: float,
        batch: StepBatch,
        n_finished: int,
        n_preempted: int,
        submitted: tuple[int, int],
        done: int,
    ) -> None: ...


def quiet_run(engine: Engine, limit: EventKey | None) -> int:
    """``Engine._iterate_async`` while it is quiet (:mod:`kvsim.engine.quiet_decode`): one
    batch in flight, no tier driver, the connector's worker quiet on the simulated
    backend (:func:`quiet_poll`), and the scheduler's step and the batch's processing
    quiet. Each such iteration launches the next decode step (polling the copies in
    flight) and processes the batch in flight (completing the copies its launch saw
    finish) exactly as the general path would; the next one follows at once while its
    step event, ``(now, PHASE_STEP)``, would come before ``limit``. Returns the
    iterations run (0: nothing changed); when it stops at ``limit`` it leaves that step
    event queued.
    """
    queue, sched, conn, clock = engine._batches, engine.scheduler, engine.connector, engine.clock
    if len(queue) != 1 or engine.tiers is not None:
        return 0
    prev = queue[0]
    poll = quiet_poll(engine)
    if poll is False:
        return 0
    # nothing below changes what was checked above: the connector queues nothing (its
    # completions only end jobs and unfence blocks), no block is fenced, the worker
    # thread submits nothing, and the queue keeps its length
    record = engine.recorder.record_steps
    on_done = engine.recorder.on_done
    pool = engine.pool
    row_free = pool.num_free  # free GPU blocks in the last row recorded whole
    runs = 0
    while quiet_decode_ready(sched, prev.entries):
        steady = steady_decode_steps(sched, prev.entries) if runs >= 2 else 0
        if steady > 1:  # a run of them, done at once (the rows repeat from the third)
            prev, n, stopped, row_free = decode_run(engine, prev, steady, limit, row_free, poll)
            runs += n
            if stopped:
                break
            if n:
                continue
        runs += 1
        engine._arrived = False
        t0 = clock.now()
        step = engine.steps
        engine.steps += 1
        if conn is not None:
            conn.idle_step(step)
        batch = schedule_quiet(sched)
        engine.computing_steps += 1
        start, end = engine._queue_forward(t0, batch)
        results = poll(t0) if poll is not None else []  # after_launch's
        launched = Launched(
            step, t0, start, end, 0.0, batch, sched.entries, results, 0, (0, 0), True
        )
        queue[0] = launched
        t_end = prev.end_s
        clock.wait_until(t_end)
        sched.begin_update(prev.batch.num_seqs > 0)
        done = complete(conn, prev.results, on_done)
        update_quiet(sched, prev.entries, t_end)
        if record and runs > 2 and not done and pool.num_free == row_free:
            # the same row as the last but for the clock: a quiet batch like the last,
            # no copy completed, and the one gauge a quiet step can move (a new block)
            # did not move
            engine.recorder.repeat_step(prev.step, prev.schedule_s, t_end, t_end - prev.start_s)
        elif record:  # the batch the general path launched, the first quiet one, a
            # step that took blocks, or one that completed copies (the next row differs)
            row_free = pool.num_free if not done else -1
            engine._record_step(
                prev.step,
                prev.schedule_s,
                t_end,
                prev.stall_s,
                t_end - prev.start_s,
                prev.batch,
                0,
                prev.n_preempted,
                prev.submitted,
                done,
            )
        prev = launched
        if not step_due_before(t_end, limit):
            engine._schedule_step(t_end)
            break
    return runs


def complete(
    conn: OffloadConnector | None,
    results: list[TransferResult],
    on_done: Callable[[ConnectorJob, TransferResult], None],
) -> int:
    """The processing of a batch's copy completions, as ``Engine._process`` does them:
    the jobs completed (the copies' ends touch no running request's counts or blocks)."""
    if not results:
        return 0
    assert conn is not None  # only a connector's jobs complete
    return conn.complete(results, on_done)


def quiet_poll(engine: Engine) -> Poll | Literal[False] | None:
    """What a quiet iteration's worker does besides the connector's
    :meth:`~kvsim.engine.connector.OffloadConnector.idle_step`: nothing (None) when no
    copy is in flight and the backend is idle (its poll would only move its time, which
    the next call moves anyway), the backend's poll at each launch while store jobs are in
    flight (each launch polls as the general path does, so the copies advance by the same
    float steps), or False: not quiet (no simulated backend, work queued or held, a block
    fenced, the worker thread still submitting)."""
    conn = engine.connector
    if conn is None:
        return None
    backend = engine.backend
    now = engine.clock.now()
    if type(backend) is not SimulatedTransferBackend or not conn.worker_quiet():
        return False
    if not conn.jobs:
        return None if backend.idle_at(now) else False
    return backend.poll if backend.host_free_time() <= now else False


def decode_run(
    engine: Engine,
    prev: Launched,
    steps: int,
    limit: EventKey | None,
    row_free: int,
    poll: Poll | None,
) -> tuple[Launched, int, bool, int]:
    """Up to ``steps`` quiet iterations in the steady state
    (:func:`~kvsim.engine.quiet_decode.steady_decode_steps`): only the clock, the
    forwards, the step rows and the decoders' block work
    (:func:`~kvsim.engine.quiet_decode.take_blocks`, in the iterations
    :func:`~kvsim.engine.quiet_decode.next_block_event` names, in running order) are
    stepped through; the requests' counts and the scheduler move once, by
    :func:`~kvsim.engine.quiet_decode.advance_decoders`. Stops before an iteration
    whose new blocks the free ones do not cover (the general path then preempts),
    and, as :func:`quiet_run` does, after the iteration whose next step would not
    come before ``limit``, leaving that step event queued.

    Copies that a launch's ``poll`` saw finish are completed as the batch is processed,
    as the general path does; that row is recorded whole, and so is the next.

    Args:
        row_free: the free GPU blocks in the last row recorded whole (a row repeats
            it only while they have not moved).
        poll: :func:`quiet_poll`'s.

    Returns:
        The batch in flight, the iterations run, whether it stopped at ``limit``, and
        ``row_free`` after them.
    """
    clock, conn, sched, pool = engine.clock, engine.connector, engine.scheduler, engine.pool
    seqs = len(sched.running)
    blocks = DecodeRunBlocks(sched, steps)
    context = sum(blocks.computed) + seqs  # the first step's: one token each in flight
    seconds = decode_step_seconds(engine.compute, seqs)
    record = engine.recorder.record_steps
    repeat = engine.recorder.repeat_step
    idle_step = conn.idle_step if conn is not None else None
    now, wait_until = clock.now, clock.wait_until
    starts: list[float] = []
    ends: list[float] = []
    stopped = False
    # _queue_forward, inlined: the GPU stream's tail and busy time as locals
    tail, busy, next_step = engine._compute_tail, engine.busy_s, engine.steps
    step, t0, start, end = prev.step, prev.schedule_s, prev.start_s, prev.end_s
    ctx: int | None = None  # the context of the batch launched last (None: prev's)
    in_flight = prev.results  # the copies the batch in flight saw finish
    on_done = engine.recorder.on_done
    for j in range(steps):
        due = blocks.due(j)
        if due is not None and not blocks.fits(due, j):
            break  # quiet_decode_ready says no now: the general path preempts
        t_end = end  # the batch in flight is processed as the next one launches
        p_step, p_t0, p_start, p_ctx = step, t0, start, ctx
        t0 = now()
        step = next_step
        next_step += 1
        if idle_step is not None:
            idle_step(step)
        if due is not None:
            blocks.work(due, j)
        dur = seconds(context)  # every request's context grows by one token a step
        ctx = context
        context += seqs
        start = max(t0, tail)
        end = start + dur
        if dur:
            tail = end
            busy += dur
        results = poll(t0) if poll is not None else []  # this launch's
        wait_until(t_end)
        done = complete(conn, in_flight, on_done)
        in_flight = results
        starts.append(t0)
        ends.append(t_end)
        if record and not done and pool.num_free == row_free:
            repeat(p_step, p_t0, t_end, t_end - p_start)
        elif record:  # this iteration took blocks or completed copies
            row_free = pool.num_free if not done else -1
            p_batch = prev.batch if p_ctx is None else quiet_batch(seqs, p_ctx)
            engine._record_step(
                p_step, p_t0, t_end, 0.0, t_end - p_start, p_batch, 0, 0, (0, 0), done
            )
        if not step_due_before(t_end, limit):
            stopped = True
            break
    engine._compute_tail, engine.busy_s, engine.steps = tail, busy, next_step
    n = len(ends)
    if ctx is None:
        return prev, 0, False, row_free
    engine.computing_steps += n
    engine._arrived = False
    advance_decoders(sched, starts, ends)
    batch = quiet_batch(seqs, ctx)
    launched = Launched(step, t0, start, end, 0.0, batch, sched.entries, in_flight, 0, (0, 0), True)
    engine._batches[0] = launched
    if stopped:
        engine._schedule_step(ends[-1])
    return launched, n, stopped, row_free
