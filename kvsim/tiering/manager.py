"""The tiering orchestrator: vLLM 0.33's ``TieringOffloadingManager`` semantics.

A CPU tier (:class:`~kvsim.tiering.primary.PrimaryTier`) in front of secondary tiers
(:class:`~kvsim.tiering.secondary.SecondaryTier`), in configuration order:

* **Cascade**: every chunk whose GPU -> CPU store completes is copied to every secondary
  tier, unless that tier's back-pressure drops the copy; the CPU chunk stays pinned until
  the copy finishes.
* **Lookup**: the CPU tier first (HIT and HIT_PENDING end it); on a miss the secondary
  tiers in order. A secondary HIT *promotes* the chunk: a CPU slot is allocated at once
  (a pending write, so later lookups see HIT_PENDING) and the lookup answers HIT_PENDING,
  or MISS when the CPU tier has no room. A tier that cannot tell yet makes the answer
  RETRY. The promotions of one step go out as one job per (tier, request), at the step's
  end; a finished promotion makes the chunk a CPU hit, which then loads to the GPU as any.
* **Failures**: a failed promotion frees the slots of the chunks that did not arrive; a
  failed cascade unpins and is counted (and feeds back-pressure).
* Finished jobs are collected at most once per step by lookups, and always before a store
  decides what to evict.

The manager is driven through the same calls as vLLM's (``lookup``, ``prepare_load`` ...,
``on_schedule_end``, ``reset_cache``); it is deterministic given its clock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import LookupResult, ManagerCounters, PrepareStoreOutput
from kvsim.tiering.jobs import JobResult, TransferJob
from kvsim.tiering.metrics import (
    BACKPRESSURE_STORE_LATENCY_EMA,
    PRIMARY_LABEL,
    Series,
    TieringMetrics,
)
from kvsim.tiering.primary import PrimaryTier
from kvsim.tiering.secondary import SecondaryTier

_HIT = LookupResult.HIT
_PENDING = LookupResult.HIT_PENDING
_MISS = LookupResult.MISS
_RETRY = LookupResult.RETRY


def no_time() -> float:
    """Cache mode's clock: no time ever passes."""
    return 0.0


@dataclass(slots=True)
class _PendingPromotion:
    ctx: RequestContext
    keys: list[ChunkKey] = field(default_factory=list)
    chunk_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _RequestState:
    ctx: RequestContext
    pending_primary_stores: int = 0
    finished: bool = False


class TieredManager:
    """CPU tier + secondary tiers behind vLLM's ``OffloadingManager`` calls."""

    def __init__(
        self,
        primary: PrimaryTier,
        tiers: Sequence[SecondaryTier],
        *,
        chunk_bytes: int = 0,
        clock: Callable[[], float] = no_time,
    ) -> None:
        self.primary = primary
        self.tiers = list(tiers)
        self.chunk_bytes = chunk_bytes
        self.clock = clock
        self.metrics = TieringMetrics(
            [t.label for t in self.tiers], primary.num_chunks, chunk_bytes
        )
        self._next_job_id = 0
        self._jobs: dict[int, tuple[TransferJob, int]] = {}
        self._promotions_held = False
        self._pending: dict[int, dict[Hashable, _PendingPromotion]] = {}
        self._polled_this_step = False
        self._requests: dict[Hashable, _RequestState] = {}
        # request -> key -> the secondary tier it was promoted from, for hit attribution
        self._load_sources: dict[Hashable, dict[ChunkKey, int]] = {}
        #: beyond vLLM (None: vLLM's behaviour): asked ``gate(tier, key, ctx, promoted)``
        #: before a secondary hit promotes (``promoted``: chunks already promoted for the
        #: request); False makes that tier's answer a MISS
        self.promotion_gate: Callable[[int, ChunkKey, RequestContext, int], bool] | None = None

    # --- jobs ---

    def _new_job(
        self,
        keys: list[ChunkKey],
        chunk_ids: list[int],
        promotion: bool,
        ctx: RequestContext,
        tier: int,
    ) -> TransferJob:
        job = TransferJob(self._next_job_id, keys, chunk_ids, promotion, ctx, self.clock())
        self._next_job_id += 1
        self._jobs[job.job_id] = (job, tier)
        self.metrics.on_job_registered(job, tier)
        return job

    def _poll_once_per_step(self) -> None:
        if not self._polled_this_step:
            self._polled_this_step = True
            self._process_finished_jobs()

    def poll_finished(self) -> None:
        """Collect finished jobs now, as vLLM's tier-poll thread does between steps."""
        self._process_finished_jobs()

    def _process_finished_jobs(self) -> None:
        for index, tier in enumerate(self.tiers):
            for result in tier.get_finished_jobs():
                job, owner = self._jobs.pop(result.job_id)
                assert owner == index, f"job {result.job_id} finished on the wrong tier"
                self.metrics.on_job_finished(job, index, result)
                if job.is_promotion:
                    self._complete_promotion(job, index, result)
                else:
                    self.primary.complete_read(job.keys)
                    self._update_backpressure(tier, job, result)

    def _complete_promotion(self, job: TransferJob, tier: int, result: JobResult) -> None:
        if result.success:
            arrived: Sequence[ChunkKey] = job.keys
            lost: Sequence[ChunkKey] = ()
        elif result.successful_keys:
            kept = set(result.successful_keys)
            arrived = result.successful_keys
            lost = [k for k in job.keys if k not in kept]
        else:
            arrived, lost = (), job.keys
        sources = self._load_sources.get(job.ctx.req_id)
        if sources is not None:
            for key in lost:
                if sources.get(key) == tier:
                    del sources[key]
        if arrived:
            self.primary.complete_store(list(arrived), job.ctx, True)
        if lost:
            self.primary.complete_store(list(lost), job.ctx, False)

    def _update_backpressure(
        self, tier: SecondaryTier, job: TransferJob, result: JobResult
    ) -> None:
        detector = tier.detector
        if detector is None:
            return
        # vLLM reads the pressure state around each update (to log changes); a read decays
        # an idle average and may clear pressure, so it is part of the semantics
        detector.is_under_pressure()
        if result.success:
            nbytes = result.transfer_bytes
            detector.update(
                job.submit_time, len(job.keys) * self.chunk_bytes if nbytes is None else nbytes
            )
        else:
            detector.on_store_failed()
        detector.is_under_pressure()

    # --- lookups and promotions ---

    def lookup(self, key: ChunkKey, ctx: RequestContext) -> LookupResult:
        """HIT (ready in the CPU tier), HIT_PENDING (being written there: a store or a
        promotion this lookup may have started), RETRY (a tier cannot tell yet) or MISS."""
        self._poll_once_per_step()
        req_id = ctx.req_id
        result = self.primary.lookup(key, ctx)
        self.metrics.on_lookup(req_id, key, PRIMARY_LABEL, result, self.clock)
        if result is _HIT or result is _PENDING:
            return result
        if self._promotions_held:
            return _MISS
        any_retry = False
        for index, tier in enumerate(self.tiers):
            found = tier.lookup(key, ctx)
            self.metrics.on_lookup(req_id, key, tier.label, found, self.clock)
            if found is _HIT:
                gate = self.promotion_gate
                if gate is not None and not gate(
                    index, key, ctx, len(self._load_sources.get(req_id, ()))
                ):
                    continue  # beyond vLLM: this tier's copy cannot pay off
                return _PENDING if self._start_promotion(index, key, ctx) else _MISS
            any_retry |= found is _RETRY
        return _RETRY if any_retry else _MISS

    def scan_prefix(self, keys: Iterable[ChunkKey], ctx: RequestContext) -> tuple[int, bool]:
        """The connector's scan (vLLM ``_lookup_complete_chunks``): HIT and HIT_PENDING count,
        a RETRY keeps the scan going, a MISS ends it; ``(count, defer)``, where ``defer``
        means some key was pending or unknown, so the request must wait."""
        lookup = self.lookup
        count = 0
        defer = False
        for key in keys:
            result = lookup(key, ctx)
            if result is _HIT:
                count += 1
            elif result is _PENDING:
                count += 1
                defer = True
            elif result is _RETRY:
                defer = True
            else:
                break
        return count, defer

    def _start_promotion(self, tier: int, key: ChunkKey, ctx: RequestContext) -> bool:
        out = self.primary.prepare_store([key], ctx)
        if out is None:
            self.metrics.on_promotion_allocation_failure()
            return False
        sources = self._load_sources.setdefault(ctx.req_id, {})
        for promoted in out.keys_to_store:
            sources[promoted] = tier
        pending = self._pending.setdefault(tier, {})
        entry = pending.get(ctx.req_id)
        if entry is None:
            entry = pending[ctx.req_id] = _PendingPromotion(ctx)
        entry.keys.extend(out.keys_to_store)
        entry.chunk_ids.extend(out.chunk_ids)
        return True

    def _flush_promotions(self) -> None:
        for tier, by_request in self._pending.items():
            for entry in by_request.values():
                job = self._new_job(entry.keys, entry.chunk_ids, True, entry.ctx, tier)
                self.tiers[tier].submit_load(job)
        self._pending.clear()

    def load_source(self, key: ChunkKey, ctx: RequestContext) -> int:
        """Where a loaded chunk came from for this request: 0 the CPU tier, ``i + 1`` the
        secondary tier ``i`` that promoted it (vLLM's ``get_load_source``, by tier)."""
        sources = self._load_sources.get(ctx.req_id)
        tier = None if sources is None else sources.get(key)
        return 0 if tier is None else tier + 1

    # --- the CPU tier's GPU-facing calls ---

    def new_context(self, req_id: Hashable, positions: dict[ChunkKey, int]) -> RequestContext:
        return RequestContext(req_id, positions)

    def prepare_load(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> list[int]:
        return self.primary.prepare_load(keys, ctx)

    def complete_load(self, keys: Iterable[ChunkKey], ctx: RequestContext | None = None) -> None:
        self.primary.complete_load(keys, ctx)

    def touch(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        self.primary.touch(keys, ctx)

    def prepare_store(
        self, keys: Iterable[ChunkKey], ctx: RequestContext
    ) -> PrepareStoreOutput | None:
        """The CPU tier's store, after collecting every finished job (so that chunks those
        jobs release can be evicted)."""
        self._polled_this_step = True
        self._process_finished_jobs()
        out = self.primary.prepare_store(keys, ctx)
        if out is not None and out.keys_to_store:
            self._requests[ctx.req_id].pending_primary_stores += 1
        return out

    def complete_store(
        self, keys: Iterable[ChunkKey], ctx: RequestContext, success: bool = True
    ) -> None:
        """The GPU -> CPU copy ended; on success the chunks cascade to every tier."""
        keys = list(keys)
        self.primary.complete_store(keys, ctx, success)
        if success:
            for index, tier in enumerate(self.tiers):
                if tier.should_store(len(keys)):
                    tier.submit_store(self.create_store_job(keys, ctx, index))
        state = self._requests[ctx.req_id]
        assert state.pending_primary_stores > 0, "complete_store without a prepared store"
        state.pending_primary_stores -= 1
        self._maybe_finalize(ctx.req_id)

    def create_store_job(self, keys: list[ChunkKey], ctx: RequestContext, tier: int) -> TransferJob:
        """Pin ``keys`` in the CPU tier and register a cascade to tier ``tier``."""
        return self._new_job(keys, self.primary.prepare_read(keys), False, ctx, tier)

    # --- requests and steps ---

    def on_new_request(self, ctx: RequestContext) -> None:
        self.metrics.on_new_request(ctx.req_id)
        for tier in self.tiers:
            tier.on_new_request(ctx)
        self._requests[ctx.req_id] = _RequestState(ctx)

    def on_request_finished(self, ctx: RequestContext) -> None:
        self.primary.on_request_finished(ctx)
        self._requests[ctx.req_id].finished = True
        self._maybe_finalize(ctx.req_id)

    def _maybe_finalize(self, req_id: Hashable) -> None:
        """The tiers hear of a finished request once its last CPU store completed (that
        store could still cascade)."""
        state = self._requests[req_id]
        if not state.finished or state.pending_primary_stores:
            return
        for tier in self.tiers:
            tier.on_request_finished(state.ctx)
        self.metrics.on_request_finished(req_id)
        self._load_sources.pop(req_id, None)
        del self._requests[req_id]

    def on_schedule_end(self, new_req_ids: Iterable[Hashable] = ()) -> None:
        """The step's last call: collect finished jobs (if no lookup did), submit the step's
        promotions, end the tiers' step; ``new_req_ids`` were scheduled this step."""
        self._poll_once_per_step()
        self._polled_this_step = False
        self._flush_promotions()
        for tier in self.tiers:
            tier.on_schedule_end()
        for req_id in new_req_ids:
            if req_id in self._requests:
                self.metrics.on_request_allocated(req_id)

    def has_pending_work(self) -> bool:
        return bool(self._jobs) or any(t.has_pending_work() for t in self.tiers)

    def reset_cache(self) -> None:
        """Empty the CPU tier once every tier transfer has finished; secondary tiers keep
        their data. Promotions are held (lookups past the CPU tier say MISS) until
        :meth:`on_reset_flushed`."""
        for tier in self.tiers:
            tier.drain_jobs()
        self._process_finished_jobs()
        assert not self._jobs
        self._pending.clear()
        self._load_sources.clear()
        finished = []
        for req_id, state in self._requests.items():
            state.pending_primary_stores = 0
            if state.finished:
                for tier in self.tiers:
                    tier.on_request_finished(state.ctx)
                self.metrics.on_request_finished(req_id)
                finished.append(req_id)
        self.primary.reset_cache()
        for req_id in finished:
            del self._requests[req_id]
        self._polled_this_step = False
        for tier in self.tiers:
            if tier.detector is not None:
                tier.detector.reset()
        self._promotions_held = bool(self.tiers)

    def on_reset_flushed(self) -> None:
        self._promotions_held = False

    # --- observation ---

    def take_stats(self) -> tuple[dict[Series, float], dict[Series, float]]:
        """``(counters so far, gauges now)``, after moving back-pressure drops the
        detectors hold into the counters (vLLM does that at each stats poll)."""
        gauges = self.metrics.gauges()
        for index, tier in enumerate(self.tiers):
            if tier.detector is not None:
                self.metrics.take_dropped(index, *tier.detector.policy.pop_dropped())
                gauges[(BACKPRESSURE_STORE_LATENCY_EMA, tier.label)] = tier.detector.ema
        return dict(self.metrics.counters), gauges

    def get_stats(self) -> dict[str, object]:
        """The CPU tier's ``vllm:kv_offload_*`` stats (the timed engine's step records)."""
        return self.primary.get_stats()

    @property
    def num_resident(self) -> int:
        return self.primary.num_resident

    @property
    def counters(self) -> ManagerCounters:
        """The CPU tier's totals (stored, evicted, loaded chunks)."""
        return self.primary.counters
