"""The ``vllm:kv_offload_tiering_*`` metrics, counted as vLLM 0.33's
``TieringMetricsTracker`` counts them (labels ``0:primary``, ``1:fs``, ...).

Counters accumulate from the start of the run; :meth:`TieringMetrics.take_dropped` moves
the back-pressure drops a detector holds into them, which vLLM does at each stats poll
(and a reset loses what was not polled yet, in vLLM as here). Timings (the lookup-delay,
read-time, write-time and promotion-latency series) are left to a timed model.

Chunk lookups are counted once per request and tier: the first HIT or MISS of a key, and
again when a lookup that said RETRY resolves; none after the request was scheduled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import LookupResult
from kvsim.tiering.jobs import JobResult, TransferJob

PREFIX = "vllm:kv_offload_tiering_"
READ_BYTES = PREFIX + "read_bytes"
WRITE_BYTES = PREFIX + "write_bytes"
PROMOTION_JOB_FAILURES = PREFIX + "promotion_job_failures"
CASCADE_JOB_FAILURES = PREFIX + "cascade_job_failures"
CHUNK_QUERIES = PREFIX + "chunk_queries"
CHUNK_HITS = PREFIX + "chunk_hits"
PRIMARY_WRITE_USAGE_PERC = PREFIX + "primary_write_usage_perc"
PRIMARY_READ_USAGE_PERC = PREFIX + "primary_read_usage_perc"
PROMOTION_ALLOCATION_FAILURES = PREFIX + "promotion_allocation_failures"
ACTIVE_PROMOTION_JOBS = PREFIX + "active_promotion_jobs"
ACTIVE_CASCADE_JOBS = PREFIX + "active_cascade_jobs"
BACKPRESSURE_STORE_LATENCY_EMA = PREFIX + "backpressure_store_latency_ema"
BACKPRESSURE_STORES_DROPPED = PREFIX + "backpressure_stores_dropped"
BACKPRESSURE_BLOCKS_DROPPED = PREFIX + "backpressure_blocks_dropped"

PRIMARY_LABEL = "0:primary"

_HIT = LookupResult.HIT
_MISS = LookupResult.MISS
_ABSENT: Any = object()  # a missing entry, where None is a value

#: (metric name, tier label or "" when unlabelled)
Series = tuple[str, str]


@dataclass
class _ActiveJobs:
    promotions: int = 0
    cascades: int = 0
    write_chunks: int = 0  # CPU chunks being written by promotions
    read_chunks: int = 0  # CPU chunks being read by cascades


class TieringMetrics:
    """Counters and gauges of one tiering manager."""

    def __init__(self, labels: Sequence[str], num_primary_chunks: int, chunk_bytes: int) -> None:
        self.labels = list(labels)
        self.num_primary_chunks = num_primary_chunks
        self.chunk_bytes = chunk_bytes
        self.counters: Counter[Series] = Counter()
        self._active = [_ActiveJobs() for _ in labels]
        # request -> tier label -> key -> None (counted) or the RETRY's time
        self._observed: dict[Hashable, dict[str, dict[ChunkKey, float | None]] | None] = {}

    # --- requests and lookups ---

    def on_new_request(self, req_id: Hashable) -> None:
        self._observed[req_id] = {}

    def on_request_allocated(self, req_id: Hashable) -> None:
        if req_id in self._observed:
            self._observed[req_id] = None

    def on_request_finished(self, req_id: Hashable) -> None:
        self._observed.pop(req_id, None)

    def on_lookup(
        self,
        req_id: Hashable,
        key: ChunkKey,
        label: str,
        result: LookupResult,
        clock: Callable[[], float],
    ) -> None:
        """Count a lookup's answer (``clock`` dates a RETRY; read only then)."""
        observed = self._observed.get(req_id, _ABSENT)
        if observed is _ABSENT:
            observed = self._observed[req_id] = {}
        if observed is None:
            return
        if result is _HIT or result is _MISS:
            seen = observed.get(label)
            if seen is None:
                seen = observed[label] = {}
            if seen.get(key, _ABSENT) is not None:  # first answer, or the end of a RETRY
                seen[key] = None
                counters = self.counters
                counters[(CHUNK_QUERIES, label)] += 1
                if result is _HIT:
                    counters[(CHUNK_HITS, label)] += 1
        elif result is LookupResult.RETRY:
            observed.setdefault(label, {}).setdefault(key, clock())

    # --- jobs ---

    def on_job_registered(self, job: TransferJob, tier: int) -> None:
        active = self._active[tier]
        if job.is_promotion:
            active.promotions += 1
            active.write_chunks += len(job.chunk_ids)
        else:
            active.cascades += 1
            active.read_chunks += len(job.chunk_ids)

    def on_job_finished(self, job: TransferJob, tier: int, result: JobResult) -> None:
        label = self.labels[tier]
        moved = len(job.keys)
        if not result.success:
            failures = PROMOTION_JOB_FAILURES if job.is_promotion else CASCADE_JOB_FAILURES
            self.counters[(failures, label)] += 1
            moved = len(result.successful_keys or ()) if job.is_promotion else 0
        if moved:
            self.counters[(READ_BYTES if job.is_promotion else WRITE_BYTES, label)] += (
                moved * self.chunk_bytes
            )
        active = self._active[tier]
        if job.is_promotion:
            active.promotions -= 1
            active.write_chunks -= len(job.chunk_ids)
        else:
            active.cascades -= 1
            active.read_chunks -= len(job.chunk_ids)

    def on_promotion_allocation_failure(self) -> None:
        self.counters[(PROMOTION_ALLOCATION_FAILURES, "")] += 1

    def take_dropped(self, tier: int, stores: int, blocks: int) -> None:
        label = self.labels[tier]
        if stores:
            self.counters[(BACKPRESSURE_STORES_DROPPED, label)] += stores
        if blocks:
            self.counters[(BACKPRESSURE_BLOCKS_DROPPED, label)] += blocks

    # --- gauges ---

    def gauges(self) -> dict[Series, float]:
        n = self.num_primary_chunks
        out: dict[Series, float] = {}
        for label, active in zip(self.labels, self._active):
            out[(PRIMARY_WRITE_USAGE_PERC, label)] = active.write_chunks / n if n else 0.0
            out[(PRIMARY_READ_USAGE_PERC, label)] = active.read_chunks / n if n else 0.0
            out[(ACTIVE_PROMOTION_JOBS, label)] = active.promotions
            out[(ACTIVE_CASCADE_JOBS, label)] = active.cascades
        return out

    def is_idle(self) -> bool:
        return all(
            a.promotions == a.cascades == a.write_chunks == a.read_chunks == 0 for a in self._active
        )
