"""One secondary tier: its store, its lookups, its jobs (vLLM's ``SecondaryTierManager``).

Jobs are submitted by the orchestrator and *finished* by whoever knows when the transfer
ends: with ``instant=True`` (cache mode, no time) at submission; otherwise by a caller of
:meth:`SecondaryTier.finish` (a timed model, or a test that says when). Either way the
orchestrator learns of it at its next poll (:meth:`get_finished_jobs`), as in vLLM.

A cascade writes its chunks when it finishes (a failed write adds nothing). A promotion
reads its chunks when it finishes, in order, and stops at the first one the tier no longer
holds, keeping those read before it (vLLM's ``fs`` tier); a caller may also fail a load
after ``keep`` chunks, as a read error would.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import LookupResult
from kvsim.options.tiers import TierSpec
from kvsim.tiering.async_lookup import AsyncLookups
from kvsim.tiering.backpressure import EMADetector
from kvsim.tiering.jobs import JobResult, TransferJob
from kvsim.tiering.store import TierStore


@dataclass
class TierCounters:
    """Totals over the run, chunks unless named otherwise (kvsim's, exact)."""

    promoted_chunks: int = 0  # read into the CPU tier by successful promotions
    cascaded_chunks: int = 0  # written by successful cascades
    dropped_stores: int = 0  # cascades skipped under back-pressure
    dropped_chunks: int = 0
    promotion_failures: int = 0  # jobs
    cascade_failures: int = 0  # jobs
    failed_promotion_chunks: int = 0


class SecondaryTier:
    """A tier of type ``fs``, ``obj`` or ``example`` at position ``index`` (label
    ``f"{index + 1}:{type}"``, vLLM's metric label)."""

    def __init__(
        self,
        spec: TierSpec,
        index: int,
        store: TierStore,
        detector: EMADetector | None = None,
        *,
        instant: bool = True,
    ) -> None:
        self.spec = spec
        self.tier_type = spec.type
        self.label = f"{index + 1}:{spec.type}"
        self.store = store
        self.detector = detector
        self.instant = instant
        self.lookups = AsyncLookups(store.contains) if spec.async_lookup else None
        self.counters = TierCounters()
        self._in_flight: dict[int, TransferJob] = {}
        self._reserved: dict[int, list[ChunkKey] | None] = {}
        self._finished: list[JobResult] = []
        self._live: set[Hashable] = set()
        #: told of each job as it is submitted when not ``instant`` (a timed model's hook)
        self.on_submit: Callable[[SecondaryTier, TransferJob], None] | None = None

    # --- lookups ---

    def lookup(self, key: ChunkKey, ctx: RequestContext) -> LookupResult:
        if self.lookups is None:
            return LookupResult.HIT if self.store.contains(key) else LookupResult.MISS
        found = self.lookups.lookup(key, ctx.req_id)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    # --- jobs ---

    def submit_store(self, job: TransferJob) -> None:
        self._reserved[job.job_id] = self.store.begin_write(job.keys, job.ctx)
        self._submit(job)

    def submit_load(self, job: TransferJob) -> None:
        self._submit(job)

    def _submit(self, job: TransferJob) -> None:
        self._in_flight[job.job_id] = job
        if self.instant:
            self.finish(job.job_id)
        elif self.on_submit is not None:
            self.on_submit(self, job)

    @property
    def in_flight(self) -> list[TransferJob]:
        return list(self._in_flight.values())

    def finish(self, job_id: int, *, ok: bool = True, keep: int = 0) -> JobResult:
        """End a job: ``ok=False`` fails it (a load then keeps its first ``keep`` chunks)."""
        job = self._in_flight.pop(job_id)
        result = (
            self._finish_load(job, ok, keep) if job.is_promotion else self._finish_store(job, ok)
        )
        self._finished.append(result)
        return result

    def _finish_store(self, job: TransferJob, ok: bool) -> JobResult:
        written = self._reserved.pop(job.job_id)
        success = ok and written is not None
        if written is not None:
            self.store.end_write(written, job.ctx, success)
        if success:
            self.counters.cascaded_chunks += len(written or ())
        else:
            self.counters.cascade_failures += 1
        return JobResult(job.job_id, success)

    def _finish_load(self, job: TransferJob, ok: bool, keep: int) -> JobResult:
        readable = 0
        for key in job.keys:
            if not self.store.contains(key):
                break
            readable += 1
        if not ok:
            readable = min(readable, keep)
        read = job.keys[:readable]
        if read and job.ctx.req_id in self._live:
            self.store.read(read, job.ctx)
        self.counters.promoted_chunks += readable
        if readable == len(job.keys):
            return JobResult(job.job_id, True)
        failed = job.keys[readable:]
        if self.lookups is not None:
            self.lookups.mark_miss(failed)
        self.counters.promotion_failures += 1
        self.counters.failed_promotion_chunks += len(failed)
        return JobResult(job.job_id, False, tuple(read) if read else None)

    def get_finished_jobs(self) -> list[JobResult]:
        out, self._finished = self._finished, []
        return out

    def drain_jobs(self) -> None:
        """Finish every job still running (successfully), as ``reset_cache`` needs."""
        for job_id in list(self._in_flight):
            self.finish(job_id)

    def has_pending_work(self) -> bool:
        return False

    # --- per request and per step ---

    def on_new_request(self, ctx: RequestContext) -> None:
        self._live.add(ctx.req_id)

    def on_request_finished(self, ctx: RequestContext) -> None:
        self._live.discard(ctx.req_id)
        if self.lookups is not None:
            self.lookups.cleanup(ctx.req_id)
        self.store.on_request_finished(ctx)

    def on_schedule_end(self) -> None:
        if self.lookups is not None:
            self.lookups.flush()
            if self.instant:
                self.lookups.answer()

    def should_store(self, num_chunks: int) -> bool:
        """Back-pressure's verdict on a cascade of ``num_chunks`` (a drop is counted)."""
        if self.detector is None or self.detector.should_store(num_chunks):
            return True
        self.counters.dropped_stores += 1
        self.counters.dropped_chunks += num_chunks
        return False
