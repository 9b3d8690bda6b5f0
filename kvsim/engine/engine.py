"""The timed engine: an event loop that replays arrivals through a vLLM v1-like engine.

Time comes from the injected clock; copies go through the injected transfer backend (the
protocol of :mod:`kvsim.engine.transfer_protocol`); the forward pass takes what the
injected compute model says, on the given link (the engine looks no name up: a run's
composition is :mod:`kvsim.engine.setup`'s). Defaults: virtual clock,
:class:`SimulatedTransferBackend` on the link. The CPU tier is the
same :class:`kvsim.manager.offload.OffloadManager` and policies as cache mode
(:meth:`kvsim.manager.offload.OffloadManager.from_config`).

One engine step at clock time t: ``schedule`` (admission, lookups, store offers) ->
``begin_execute`` (flush stall, submit last step's stores, submit loads) -> forward pass ->
``end_execute`` (queue this step's stores, poll completions) -> ``update`` (tokens,
finishes). The next step starts when the forward ends; an engine with nothing to compute
sleeps until the next arrival or transfer completion (event order: :mod:`.events`).

With ``EngineParams.async_scheduling`` (vLLM 0.33's default) the loop is vLLM's
``EngineCore.step_with_batch_queue`` with a queue of two batches: a step is scheduled and
launched (``_launch``: schedule, worker calls, forward queued on the GPU behind the previous
one) and, while the queue has room, the next one is scheduled at once; otherwise the oldest
batch is waited for and processed (``_process``: its transfer completions and tokens). So
``schedule(N+1)`` runs when ``N-1`` is processed, while forward ``N`` still runs.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvsim.core.context import RequestContext, chunk_positions
from kvsim.core.errors import EngineStalled, InputError, InputWarning
from kvsim.core.units import GIB
from kvsim.engine import quiet_loop
from kvsim.engine.arrivals import ArrivalSource, TraceArrivals, arrival_times
from kvsim.engine.clock import Clock, VirtualClock
from kvsim.engine.connector import OffloadConnector
from kvsim.engine.events import (
    PHASE_ARRIVAL,
    PHASE_STEP,
    PHASE_TRANSFER,
    EventKey,
    EventQueue,
    earliest,
)
from kvsim.engine.launched import Launched
from kvsim.engine.params import EngineParams
from kvsim.engine.recorder import Recorder
from kvsim.engine.request_state import REJECTED, WAITING_FOR_KV, SimRequest
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.step_batch import StepBatch
from kvsim.engine.tier_driver import TierDriver
from kvsim.engine.transfer_model import TransferModelParams
from kvsim.engine.transfer_protocol import TransferBackend, TransferResult
from kvsim.manager.gpu_cache import GpuBlockPool
from kvsim.manager.offload import OffloadManager
from kvsim.options.config import CacheConfig
from kvsim.specs.context import engine_max_model_len, kv_shortfall, served_output
from kvsim.specs.hardware import GpuSpec
from kvsim.specs.models import ModelSpec
from kvsim.specs.sizing import NULL_GPU_BLOCKS, usable_gpu_blocks
from kvsim.tiering.build import build_tiered_manager
from kvsim.tiering.store import TierStore
from kvsim.traces.model import Request

# the async loop runs quiet decode iterations (kvsim.engine.quiet_decode) without the
# general step machinery; False: every iteration takes the general path (the tests compare)
QUIET_DECODE = True
POLL_INTERVAL_S = 0.001  # how often to poll a backend that cannot predict completions
BATCH_QUEUE_DEPTH = 2  # vLLM max_concurrent_batches under async scheduling


def gpu_kv_blocks(model: ModelSpec, gpu: GpuSpec, params: EngineParams) -> int:
    """vLLM's ``num_gpu_blocks``: memory * utilization - weights - activations, in GPU blocks
    of ``params.gpu_block_tokens`` tokens (or ``params.gpu_blocks``, as vLLM's
    ``num_gpu_blocks_override``). One of them is vLLM's null block: requests get
    :func:`kvsim.specs.sizing.usable_gpu_blocks` of them."""
    block_tokens = params.gpu_block_tokens
    weights = model.weight_bytes() / params.tp
    if params.gpu_blocks is not None:
        if weights >= gpu.memory_bytes:  # vLLM could not load the model to use them
            warnings.warn(
                f"{model.name}'s weights ({weights / GIB:.1f} GiB per GPU at tp={params.tp}) "
                f"do not fit in {gpu.name}'s {gpu.memory_bytes / GIB:.0f} GiB: vLLM would not "
                f"start; the run uses the {params.gpu_blocks:,} GPU blocks given regardless",
                InputWarning,
                stacklevel=2,
            )
        return params.gpu_blocks
    avail = (
        gpu.memory_bytes * params.gpu_memory_utilization
        - weights
        - params.activation_reserve_gib * GIB
    )
    per_block = model.gpu_kv_bytes_per_token(tp=params.tp) * block_tokens
    n = int(avail // per_block)
    if n <= NULL_GPU_BLOCKS:
        raise InputError(
            f"{model.name} does not fit on {gpu.name} at tp={params.tp} with "
            f"gpu_memory_utilization={params.gpu_memory_utilization}: no memory left for KV"
        )
    # from memory, an estimate (the activations' reserve is a labelled assumption): said,
    # and the run goes on
    window = None
    if model.sliding_window and model.full_attention_layers == 0:  # every layer slides
        batches = BATCH_QUEUE_DEPTH if params.async_scheduling else 1
        window = model.sliding_window - 1 + batches * params.max_num_batched_tokens
    short = kv_shortfall(
        engine_max_model_len(model, params.max_model_len),
        block_tokens,
        usable_gpu_blocks(n),
        window,
    )
    if short:
        warnings.warn(
            f"{model.name} on {gpu.name} at tp={params.tp}: {short}; lower max_model_len or "
            "give the KV more memory (gpu_memory_utilization, tp); the run goes on as given",
            InputWarning,
            stacklevel=2,
        )
    return n


class Engine:
    """One modelled vLLM server: a trace's arrivals through scheduler, connector and backend."""

    def __init__(
        self,
        config: CacheConfig,
        params: EngineParams | None = None,
        *,
        model: ModelSpec,
        gpu: GpuSpec,
        compute: Callable[[StepBatch], float],
        transfer: TransferModelParams,
        backend: TransferBackend | None = None,
        clock: Clock | None = None,
        offload: bool = True,
        manager: Any | None = None,
        requests_for_future: Iterable[Request] | None = None,
        progress: Callable[[int], None] | None = None,
        tier_stores: Mapping[int, TierStore] | None = None,
    ) -> None:
        self.config = config
        self.params = params = params or EngineParams()
        self.model = model
        self.gpu = gpu
        self.layout = config.layout
        self.clock = clock if clock is not None else VirtualClock()
        self.compute = compute
        self.transfer = transfer
        self.backend = backend if backend is not None else SimulatedTransferBackend(self.transfer)
        self.num_gpu_blocks = gpu_kv_blocks(self.model, self.gpu, params)  # vLLM's, null included
        self.usable_gpu_blocks = usable_gpu_blocks(self.num_gpu_blocks)
        self.pool = GpuBlockPool(self.usable_gpu_blocks)
        self.offload = offload
        self.manager = None
        self.connector: OffloadConnector | None = None
        self.tiers: TierDriver | None = None  # secondary tiers on their devices
        if offload:
            if manager is None and config.secondary_tiers:
                self.tiers = TierDriver(self.clock, config)
                manager = build_tiered_manager(
                    config,
                    requests_for_future,
                    instant=False,
                    clock=self.tiers.now,
                    stores=tier_stores,
                )
                self.tiers.attach(manager)
            self.manager = (
                manager
                if manager is not None
                else OffloadManager.from_config(config, requests_for_future)
            )
            self.connector = OffloadConnector(
                self.manager,
                self.layout,
                kv_bytes_per_token=self.model.kv_bytes_per_token(tp=params.tp),
                num_layers=self.model.num_layers,
                gpu_block_tokens=params.gpu_block_tokens,
                prompt_only=params.offload_prompt_only,
                sync_load_budget_bytes=params.sync_load_budget_bytes,
            )
        if self.tiers is not None and self.connector is not None:
            self.tiers.set_load_rule(
                self.compute, self.transfer.h2d, self.connector, params.max_num_batched_tokens
            )
        self.scheduler = Scheduler(params, self.pool, self.layout.unit_tokens, self.connector)
        self.recorder = Recorder(params.record_steps)
        self.progress = progress
        self.events = EventQueue()
        self.steps = 0
        self.computing_steps = 0  # steps that scheduled tokens
        self.busy_s = 0.0
        self.rescues = 0  # ordering deadlocks broken (see Scheduler.rescue)
        self._step_at: float | None = None
        self._token = 0
        self._source: ArrivalSource = TraceArrivals(iter(()))  # the arrivals, set by run()
        self._tell_finishes = False  # the source decides sends by finishes (a closed loop)
        self._arrival_events = 0  # arrival events (requests or wake-ups) in the queue
        self._request_pending = False  # a request arrival is in the queue
        self._external = False  # a caller hands requests in (arrive), see start()
        self._ran = False
        # async scheduling: launched batches (newest first), end of the last forward launched
        self._batches: deque[Launched] = deque()
        self._compute_tail = -math.inf
        self._arrived = False

    # --- event plumbing ---

    def _schedule_step(self, t: float, phase: int = PHASE_STEP) -> None:
        self._token += 1
        self._step_at = t
        self.events.push(t, phase, self._token)

    @property
    def _arrivals_left(self) -> bool:
        return self._arrival_events > 0 or self._external

    def _push_next_arrival(self, now: float) -> None:
        """Ask the source for its next arrival while none is pending; ``now``: the time of
        what happened (an arrival, a wake-up, a finish), which a step may have passed."""
        if self._request_pending:
            return
        nxt = self._source.next_arrival(now)
        if nxt is not None:
            self._arrival_events += 1
            self._request_pending = nxt[1] is not None
            self.events.push(nxt[0], PHASE_ARRIVAL, nxt)

    def run(self, requests: Iterable[Request] | ArrivalSource) -> Engine:
        """Run ``requests`` (a trace's requests, re-timed by ``params``, or an
        :class:`ArrivalSource` whose sends may depend on finishes) to the end."""
        self.start(requests)
        events = self.events
        while events:
            self.handle_next()
        self.finish()
        return self

    # --- the public step API: a fleet interleaves several engines by time ---

    def start(
        self, requests: Iterable[Request] | ArrivalSource = (), *, more_arrivals: bool = False
    ) -> None:
        """Begin a run: ``requests`` arrive on their own (see :meth:`run`);
        ``more_arrivals``: a caller will also hand requests in with :meth:`arrive` (an
        engine that waits for work then waits for them, not a stall, until
        :meth:`no_more_arrivals`)."""
        if self._ran:
            raise RuntimeError("an Engine runs once; build a new one")
        self._ran = True
        p = self.params
        if hasattr(requests, "next_arrival"):
            self._source = requests  # type: ignore[assignment]
            self._tell_finishes = getattr(requests, "wants_finishes", True)
        else:
            timed = arrival_times(requests, p.time_scale, p.poisson_rate, p.seed)
            self._source = TraceArrivals(iter(timed))
        self._external = more_arrivals
        self._push_next_arrival(self.clock.now())

    def next_event(self) -> tuple[float, int] | None:
        """``(time, phase)`` of the next event (:mod:`.events`), or None when idle."""
        return self.events.peek_key()

    def handle_next(self, horizon: EventKey | None = None) -> None:
        """Take the next event: an arrival (or wake-up) of the engine's own source, or a
        step (stale step events are dropped).

        Args:
            horizon: ``(time, phase)`` of the next event outside this engine that may read
                or change it (a fleet's next arrival, another instance's next event), or
                None when there is none. Quiet decode iterations due before both it and
                the engine's own next event run in this call.
        """
        t, phase, payload = self.events.pop()
        self.clock.wait_until(t)
        if phase == PHASE_ARRIVAL:
            self._arrival_events -= 1
            if payload[1] is None:  # the source's wake-up
                self._push_next_arrival(t)
                return
            self._request_pending = False
            self._admit(*payload)
            self._arrived = True
            self._push_next_arrival(t)
            self._step_soon()
        elif payload == self._token:
            self._step_at = None
            if self.params.async_scheduling:
                self._iterate_async(earliest(self.events.peek_key(), horizon))
            else:
                self._after_step(self._step())

    def _step_soon(self) -> None:
        """A request arrived: step now unless a step is due sooner."""
        now = self.clock.now()
        if self._step_at is None or self._step_at > now:
            self._schedule_step(now)

    def arrive(self, arrival: float, req: Request) -> None:
        """``req``, handed in by the caller, arrives at ``arrival`` (not before the
        engine's clock): admit it and step now unless a step is due sooner."""
        self.clock.wait_until(arrival)
        self._admit(arrival, req)
        self._arrived = True
        self._step_soon()

    def no_more_arrivals(self) -> None:
        """The caller of :meth:`arrive` has no more requests."""
        self._external = False
        if not self.events and self.scheduler.has_requests:  # waiting for an arrival that
            self._schedule_step(self.clock.now())  # will not come: rescue, or say it stalled

    def finish(self) -> None:
        """After the last event: let in-flight copies and tier jobs finish."""
        self._drain()
        if not self._source.done:
            raise RuntimeError(
                f"engine idle at t={self.clock.now():.6f}s while its arrival source still had "
                "requests to send"
            )

    def _admit(self, arrival: float, req: Request) -> None:
        layout = self.layout
        unit_keys = layout.unit_keys(req.block_hashes, req.input_tokens)
        chunk_keys = layout.chunk_keys(unit_keys)
        if chunk_keys is unit_keys:
            chunk_keys = list(unit_keys)
        positions = chunk_positions(chunk_keys, layout.chunk_tokens)
        manager = self.manager
        ctx = (
            manager.new_context(req.request_id, positions)
            if manager is not None
            else RequestContext(req.request_id, positions)
        )
        sr = SimRequest(
            req.request_id,
            arrival,
            req.input_tokens,
            max(1, req.output_tokens),
            unit_keys,
            chunk_keys,
            ctx,
        )
        self.recorder.requests.append(sr)
        p = self.params
        block = p.gpu_block_tokens
        # as vLLM's server takes a request under max_model_len (default: the length vLLM
        # derives from the model's config): refused, or its output cut to what is left
        max_len = engine_max_model_len(self.model, p.max_model_len)
        served = served_output(sr.prompt, sr.output, max_len, p.refuse_past_max_model_len)
        if served is not None:
            sr.output = served
        length = sr.prompt + sr.output
        # refused as vLLM refuses a request longer than its KV: the GPU holds it whole, and
        # without chunked prefill vLLM requires max_model_len <= max_num_batched_tokens
        if (
            served is None
            or -(-length // block) > self.usable_gpu_blocks
            or (not p.enable_chunked_prefill and length > p.max_num_batched_tokens)
        ):
            sr.status = REJECTED
            self._finished([sr], arrival)
            return
        if manager is not None:
            manager.on_new_request(ctx)
        self.scheduler.waiting.append(sr)

    def _finished(self, done: list[SimRequest], t: float) -> None:
        """Count finished (or refused) requests; tell a closed-loop source, which may send
        its next request now."""
        if self.progress is not None:
            self.progress(len(done))
        if self._tell_finishes:
            for r in done:
                self._source.finished(r.rid, t)
            self._push_next_arrival(t)

    # --- one engine step ---

    def _begin_step(self) -> tuple[int, float, StepBatch, float]:
        """Schedule the next step, then the worker's part before its forward (flush, the
        previous step's stores, sync loads): ``(step, schedule time, batch, stall)``. Both
        loops start a step so; stores never start before the last forward launched ends."""
        clock, conn = self.clock, self.connector
        t0 = clock.now()
        step = self.steps
        self.steps += 1
        tiers = self.tiers
        if tiers is not None:
            tiers.advance(t0)
        batch = self.scheduler.schedule(t0, step)
        if batch.num_seqs:
            self.computing_steps += 1
        if tiers is not None:
            tiers.after_schedule(t0)
        stall = (
            conn.begin_execute(self.backend, clock, self.recorder.on_submit, self._compute_tail)
            if conn is not None
            else 0.0
        )
        return step, t0, batch, stall

    def _step(self) -> bool:
        clock, sched, conn, rec = self.clock, self.scheduler, self.connector, self.recorder
        step, t0, batch, stall = self._begin_step()
        t1 = clock.now()
        dur = self.compute(batch)
        if conn is not None:
            conn.after_launch(self.backend, t1, t1 + dur, rec.on_submit)
        if dur:
            clock.wait_until(t1 + dur)
            self.busy_s += dur
        t2 = clock.now()
        done = conn.end_execute(self.backend, t2, rec.on_done) if conn is not None else 0
        n_preempted = len(sched.preempted)
        finished = sched.update(t2)
        if finished:
            self._finished(finished, t2)
        submitted = (conn.loads_submitted, conn.stores_submitted) if conn is not None else (0, 0)
        if rec.record_steps:
            self._record_step(
                step, t0, t2, stall, t2 - t1, batch, len(finished), n_preempted, submitted, done
            )
        return bool(batch.num_seqs or done or submitted[0] or submitted[1])

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
    ) -> None:
        """One row of the steps table. ``submitted`` is the step's own (loads, stores): in the
        async loop the connector's counters belong to a later launch by the time a step is
        processed."""
        sched, conn, pool = self.scheduler, self.connector, self.pool
        waiting_kv = (
            sum(1 for r in sched.kv_holding if r.status == WAITING_FOR_KV)
            if conn is not None
            else 0
        )
        stats = self.manager.get_stats() if self.manager is not None else None
        ints = (
            step,
            batch.num_seqs,
            batch.num_prefill_seqs,
            batch.prefill_tokens,
            batch.decode_tokens,
            len(sched.running),
            sched.num_waiting - waiting_kv,
            waiting_kv,
            pool.num_free,
            n_finished,
            n_preempted,
            submitted[0],
            submitted[1],
            done,
            conn.allocation_failures if conn else 0,
            self.manager.num_resident if self.manager else 0,
            conn.load_bytes if conn else 0,
            conn.store_bytes if conn else 0,
        )
        self.recorder.step((t0, t2, stall, fwd, pool.usage()), ints, stats)
        if self.tiers is not None:
            self.tiers.record_step(step)

    def _after_step(self, progress: bool) -> None:
        sched, conn = self.scheduler, self.connector
        now = self.clock.now()
        queued = conn is not None and conn.has_queued_work
        in_flight = conn is not None and bool(conn.jobs)
        # vLLM keeps stepping while the connector has jobs in flight (has_pending_push_work),
        # so their completions are seen when they happen, not at the next arrival
        if not (sched.running or sched.num_waiting or queued or in_flight):
            return  # idle until the next arrival
        if progress or queued:
            self._schedule_step(now)
            return
        if not self._wake_at_transfer(now):
            self._rescue_or_stall(now)

    def _wake_at_transfer(self, now: float) -> bool:
        """Nothing happened this step: wake at the next transfer completion (or poll a
        backend that cannot predict one). False when no transfer is in flight."""
        nct = self.backend.next_completion_time()
        if self.tiers is not None:  # a tier job or check a waiting request may need
            tt = self.tiers.next_event_time()
            if tt is not None and (nct is None or tt < nct):
                nct = tt
        if nct is not None:
            self._schedule_step(max(nct, now), PHASE_TRANSFER)
            return True
        conn = self.connector
        if conn is not None and conn.jobs:
            self._schedule_step(now + POLL_INTERVAL_S, PHASE_TRANSFER)
            return True
        return False

    def _rescue_or_stall(self, now: float) -> None:
        """Work is waiting and nothing can move it: break the holders' deadlock, wait for the
        next arrival, or fail loudly."""
        sched = self.scheduler
        if sched.rescue():
            self.rescues += 1
            self._schedule_step(now)
        elif not self._arrivals_left:
            raise EngineStalled(
                f"engine stalled at t={now:.6f}s with {sched.num_waiting} waiting "
                f"({len(sched.kv_holding)} holding GPU blocks) and {len(sched.running)} running "
                "requests and nothing in flight: the waiting ones need GPU blocks they can never "
                "get (vLLM 0.33 stops in the same state); give more GPU blocks"
            )

    # --- async scheduling: vLLM's batch queue ---

    def _iterate_async(self, limit: EventKey | None = None) -> None:
        """One ``step_with_batch_queue`` at the current host time: launch a step when the
        scheduler has work; return at once while the queue has room (and the step computed
        or work is left), else process the oldest batch. Then wake up again now, or, when
        nothing happened, at the next transfer completion (arrivals wake it themselves).

        Quiet iterations come first (:func:`~kvsim.engine.quiet_loop.quiet_run`, until
        ``limit``: the next event anything else holds; None: no event)."""
        if QUIET_DECODE and quiet_loop.quiet_run(self, limit) and self._step_at is not None:
            return  # it stopped at the limit, its next step queued
        sched, queue = self.scheduler, self._batches
        progress, self._arrived = self._arrived, False
        if not (sched.has_requests or queue):
            return  # idle until the next arrival
        if sched.has_requests:
            launched = self._launch()
            queue.appendleft(launched)
            if len(queue) < BATCH_QUEUE_DEPTH and (launched.batch.num_seqs or sched.has_requests):
                self._schedule_step(self.clock.now())
                return
            progress |= launched.progress
        done = queue.pop()
        self._process(done)
        progress |= done.progress
        # a batch left queued with nothing to schedule is processed by the next call at once
        if progress or (queue and not sched.has_requests):
            self._schedule_step(self.clock.now())
        else:
            self._sleep_async()

    def _queue_forward(self, t: float, batch: StepBatch) -> tuple[float, float]:
        """``batch``'s forward, launched at ``t``: it starts behind the last one on the
        GPU's stream. Returns its ``(start, end)``."""
        dur = self.compute(batch)
        start = max(t, self._compute_tail)
        end = start + dur
        if dur:
            self._compute_tail = end
            self.busy_s += dur
        return start, end

    def _launch(self) -> Launched:
        """Schedule a step and run its worker calls; its forward starts behind the last one."""
        clock, sched, conn, rec = self.clock, self.scheduler, self.connector, self.recorder
        step, t0, batch, stall = self._begin_step()
        entries = sched.entries
        n_preempted = len(sched.preempted)
        t1 = clock.now()
        start, end = self._queue_forward(t1, batch)
        results: list[TransferResult] = []
        submitted = (0, 0)
        queued = False
        if conn is not None:
            conn.after_launch(self.backend, t1, end, rec.on_submit)
            conn.queue_stores()
            results = conn.take_results()
            submitted = (conn.loads_submitted, conn.stores_submitted)
            queued = bool(conn.store_now)
        progress = bool(batch.num_seqs or stall > 0 or results or queued)
        return Launched(
            step, t0, start, end, stall, batch, entries, results, n_preempted, submitted, progress
        )

    def _process(self, b: Launched) -> None:
        """Wait for ``b``'s forward, then vLLM ``update_from_output``: deferred block frees,
        its transfer completions, its tokens and finishes."""
        clock, sched, conn, rec = self.clock, self.scheduler, self.connector, self.recorder
        clock.wait_until(b.end_s)
        sched.begin_update(b.batch.num_seqs > 0)
        done = conn.complete(b.results, rec.on_done) if conn is not None else 0
        finished = sched.update(b.end_s, b.entries)
        if finished:
            self._finished(finished, b.end_s)
        if rec.record_steps:
            self._record_step(
                b.step,
                b.schedule_s,
                b.end_s,
                b.stall_s,
                b.end_s - b.start_s,
                b.batch,
                len(finished),
                b.n_preempted,
                b.submitted,
                done,
            )

    def _sleep_async(self) -> None:
        """Nothing happened: wake at the next transfer completion (or poll), or stay idle
        until the next arrival."""
        now = self.clock.now()
        if self._wake_at_transfer(now):
            return
        if not self.scheduler.has_requests:
            if self._batches:
                self._schedule_step(now)
            return
        self._rescue_or_stall(now)

    def _drain(self) -> None:
        """After the last step: let in-flight copies finish and account them, then the
        tier jobs (each at its own time)."""
        conn = self.connector
        if conn is not None and conn.jobs:
            t, results = self.backend.wait(list(conn.jobs), self.clock.now())
            self.clock.wait_until(t)
            conn._held_results.extend(results)
            conn.end_execute(self.backend, self.clock.now(), self.recorder.on_done)
        if self.tiers is not None:
            self.tiers.finish_all()
