"""Secondary tiers on the engine's clock: each tier's jobs run on its device model.

The tiering manager (:mod:`kvsim.tiering`, vLLM's ``TieringOffloadingManager``) runs with
``instant=False`` tiers: a job it submits goes to the tier's :class:`TierDevice`, which
says when it ends. :meth:`TierDriver.advance`, called at the start of each engine step,
replays what ended since the last call in time order: each finished job is finished on
its tier and collected by the manager *at its finish time* (the manager's clock is the
driver's, which reads the event's time while it is replayed), as vLLM's tier-poll thread
collects jobs between steps; so back-pressure sees each store's device latency. An
existence-check batch (``fs``, ``obj``) is answered ``lookup_latency_s`` after the step
that sent it. A request waiting for a promotion is deferred by the connector, as in vLLM;
when nothing else can move, the engine sleeps until :meth:`next_event_time`.

The driver also keeps what the outputs need: every tier job (the Chrome trace, promotion
times) and per request the promotions made for it (its wait and the tier its hit came
from). The opt-in load rule (beyond vLLM) lives in :mod:`kvsim.engine.load_rule`.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvsim.engine.clock import Clock
from kvsim.engine.load_rule import LoadCosts, PaysOffRule
from kvsim.engine.step_batch import StepBatch
from kvsim.engine.transfer_model import DirectionParams
from kvsim.options.config import CacheConfig
from kvsim.tiering.devices import DeviceSpec, TierDevice, tier_device
from kvsim.tiering.jobs import TransferJob
from kvsim.tiering.manager import TieredManager
from kvsim.tiering.secondary import SecondaryTier

if TYPE_CHECKING:
    from kvsim.engine.connector import OffloadConnector

#: the ``tier_jobs`` table's columns
TIER_JOB_COLUMNS = (
    "tier",
    "label",
    "job",
    "kind",
    "request",
    "chunks",
    "bytes",
    "submit_s",
    "end_s",
    "duration_s",
    "success",
)


@dataclass(slots=True)
class RequestPromotions:
    """The promotions made for one request: when the first was submitted, when the last
    ended, and the chunks that arrived from each tier."""

    first_submit: float
    last_end: float = math.nan
    chunks: dict[int, int] = field(default_factory=dict)


class TierDriver:
    """The secondary tiers' devices and the engine's clock, for one run."""

    def __init__(self, clock: Clock, config: CacheConfig) -> None:
        self.clock = clock
        self.chunk_bytes = config.chunk_bytes or 0
        self.specs: list[DeviceSpec] = [
            tier_device(spec, f"secondary tier {i + 1}:{spec.type}")
            for i, spec in enumerate(config.secondary_tiers)
        ]
        self.devices = [TierDevice(spec) for spec in self.specs]
        self._at: float | None = None  # the time of the event being replayed
        self.manager: TieredManager | None = None
        self._tiers: list[SecondaryTier] = []
        self._index: dict[int, int] = {}
        self._answers: list[deque[tuple[float, int]]] = [deque() for _ in self.devices]
        self._sent: list[int] = [0 for _ in self.devices]
        # (tier, job) -> (is a promotion, request, chunks, submitted)
        self._open: dict[tuple[int, int], tuple[bool, Hashable, int, float]] = {}
        self.jobs: list[tuple[object, ...]] = []
        self.promotions: dict[Hashable, RequestPromotions] = {}
        self.costs: LoadCosts | None = None
        # per recorded step: the step, then each tier's jobs in flight and resident chunks
        self._gauges = array("q")
        self.rule: PaysOffRule | None = None

    @property
    def labels(self) -> list[str]:
        """vLLM's metric label of each tier (``1:fs``)."""
        return [tier.label for tier in self._tiers]

    def check_latency_s(self, tier: int) -> float:
        """One existence check on ``tier`` (0 for a tier that answers at once)."""
        return self.specs[tier].lookup_latency_s if self._tiers[tier].lookups is not None else 0.0

    def now(self) -> float:
        """The manager's clock: the engine's, or the time of the event being replayed."""
        at = self._at
        return self.clock.now() if at is None else at

    def attach(self, manager: TieredManager) -> None:
        self.manager = manager
        self._tiers = manager.tiers
        for index, tier in enumerate(manager.tiers):
            self._index[id(tier)] = index
            tier.on_submit = self._on_submit

    def set_load_rule(
        self,
        compute: Callable[[StepBatch], float],
        h2d: DirectionParams,
        connector: OffloadConnector,
        step_tokens: int,
    ) -> None:
        """The load and recompute estimates of this engine (for the report), and the
        ``pays-off`` rule on the tiers that ask for it (beyond vLLM)."""
        self.costs = LoadCosts(
            compute,
            h2d,
            chunk_tokens=connector.tpc,
            chunk_bytes=self.chunk_bytes,
            kv_bytes_per_token=connector.kv_bytes_per_token,
            copies_per_token=connector.copies_per_token,
            step_tokens=step_tokens,
        )
        ruled = {i for i, tier in enumerate(self._tiers) if tier.spec.load_rule == "pays-off"}
        if ruled and self.manager is not None:
            stores = [tier.store.contains for tier in self._tiers]
            self.rule = PaysOffRule(self.costs, self.devices, stores, ruled)
            self.manager.promotion_gate = self.rule

    # --- jobs ---

    def _on_submit(self, tier: SecondaryTier, job: TransferJob) -> None:
        index = self._index[id(tier)]
        now = self.now()
        chunks = len(job.keys)
        self.devices[index].submit(
            job.job_id, job.is_promotion, chunks, self.chunk_bytes, job.submit_time
        )
        self._open[(index, job.job_id)] = (job.is_promotion, job.ctx.req_id, chunks, now)
        if job.is_promotion and job.ctx.req_id not in self.promotions:
            self.promotions[job.ctx.req_id] = RequestPromotions(now)

    def after_schedule(self, now: float) -> None:
        """Date the existence checks the step just sent (answered after the latency)."""
        for index, tier in enumerate(self._tiers):
            lookups = tier.lookups
            if lookups is None:
                continue
            sent = lookups.batches_sent
            new = sent - self._sent[index]
            if new > 0:
                self._answers[index].append((now + self.specs[index].lookup_latency_s, new))
            self._sent[index] = sent

    def advance(self, now: float) -> None:
        """Replay, in time order, the jobs that ended and the checks answered by ``now``."""
        events: list[tuple[float, int, int, int]] = []
        for index, device in enumerate(self.devices):
            if device.busy or device.finished:
                device.advance(now)
                events.extend((t, index, 0, job) for t, job in device.take_finished())
        for index, answers in enumerate(self._answers):
            while answers and answers[0][0] <= now:
                t, n = answers.popleft()
                events.append((t, index, 1, n))
        if events:
            self._replay(sorted(events))

    def _replay(self, events: list[tuple[float, int, int, int]]) -> None:
        manager = self.manager
        assert manager is not None
        try:
            for t, index, kind, value in events:
                self._at = t
                tier = self._tiers[index]
                if kind == 1:
                    lookups = tier.lookups
                    assert lookups is not None
                    lookups.answer(value)
                    self._sent[index] -= value
                    continue
                result = tier.finish(value)
                promotion, req_id, chunks, submitted = self._open.pop((index, value))
                self.jobs.append(
                    (
                        index + 1,
                        tier.label,
                        value,
                        "promotion" if promotion else "cascade",
                        req_id,
                        chunks,
                        chunks * self.chunk_bytes,
                        submitted,
                        t,
                        t - submitted,
                        result.success,
                    )
                )
                record = self.promotions.get(req_id) if promotion else None
                if record is not None:
                    arrived = chunks if result.success else len(result.successful_keys or ())
                    record.last_end = t
                    record.chunks[index] = record.chunks.get(index, 0) + arrived
                manager.poll_finished()
        finally:
            self._at = None

    def next_event_time(self) -> float | None:
        """When the next job ends or check is answered, if nothing more is submitted."""
        best: float | None = None
        for index, device in enumerate(self.devices):
            t = device.next_finish_time()
            if t is not None and (best is None or t < best):
                best = t
            answers = self._answers[index]
            if answers and (best is None or answers[0][0] < best):
                best = answers[0][0]
        return best

    def record_step(self, step: int) -> None:
        """Each tier's gauges after engine step ``step`` (the steps table's tier columns)."""
        row = [step]
        for device, tier in zip(self.devices, self._tiers, strict=True):
            row += (device.jobs_in_flight, len(tier.store))
        self._gauges.extend(row)

    def step_gauges(self) -> dict[str, list[int]]:
        """The recorded gauges as columns: ``step``, then per tier ``tier1_fs_jobs_in_flight``
        and ``tier1_fs_resident_chunks`` (vLLM's label ``1:fs`` as in the summary)."""
        width = 1 + 2 * len(self._tiers)
        columns: dict[str, list[int]] = {"step": list(self._gauges[0::width])}
        for i, tier in enumerate(self._tiers):
            name = f"tier{i + 1}_{tier.tier_type}"
            columns[f"{name}_jobs_in_flight"] = list(self._gauges[1 + 2 * i :: width])
            columns[f"{name}_resident_chunks"] = list(self._gauges[2 + 2 * i :: width])
        return columns

    def finish_all(self) -> None:
        """After the last step: let every tier job and check end, at its own time."""
        self.advance(math.inf)

    @property
    def busy(self) -> bool:
        return any(d.busy for d in self.devices) or any(self._answers)
