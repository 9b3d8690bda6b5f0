"""Both tiering managers side by side for ``tests/vllm/test_vllm_tiering_differential.py``:
vLLM 0.33's ``TieringOffloadingManager`` over its CPU primary tier with a scripted secondary
tier (jobs finish when the test says), vLLM's async lookups run by the test and its
backpressure detector on the test's clock; kvsim's ``TieredManager`` with the same tiers,
lookups and detector. :class:`Pair` makes every call on both and compares what comes back.
Importing it skips the test module when vLLM is not importable."""

from __future__ import annotations

import random
import types
from collections import Counter
from dataclasses import dataclass, field

import pytest
from support import kvsim_key, need_vllm, vllm_key

vtm = need_vllm("vllm.v1.kv_offload.tiering.manager")
vtb = need_vllm("vllm.v1.kv_offload.tiering.base")
vbp = need_vllm("vllm.v1.kv_offload.tiering.backpressure")
val = need_vllm("vllm.v1.kv_offload.tiering.async_lookup")
vbase = need_vllm("vllm.v1.kv_offload.base")

from kvsim.core.context import RequestContext  # noqa: E402
from kvsim.manager.offload import LookupResult  # noqa: E402
from kvsim.options.tiers import BackpressureSpec, TierSpec  # noqa: E402
from kvsim.policies.registry import make_eviction_policy  # noqa: E402
from kvsim.tiering.backpressure import EMADetector  # noqa: E402
from kvsim.tiering.manager import TieredManager  # noqa: E402
from kvsim.tiering.metrics import PREFIX  # noqa: E402
from kvsim.tiering.primary import PrimaryTier  # noqa: E402
from kvsim.tiering.secondary import SecondaryTier  # noqa: E402
from kvsim.tiering.store import UnboundedStore  # noqa: E402

CHUNK_BYTES = 1 << 20  # 1 MiB: the detector's seconds per MiB are the job's seconds per chunk


class Clock:
    """The test's clock, read by both sides' detectors and job submit times."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- vLLM's side ---


class _Region:
    """Stands in for vLLM's shared-memory region: a plain buffer of chunk rows."""

    def __init__(self, num_chunks: int) -> None:
        self._buffer = bytearray(max(num_chunks, 1) * CHUNK_BYTES)
        self._rows = max(num_chunks, 1)

    def create_kv_memoryview(self) -> memoryview:
        return memoryview(self._buffer).cast("B", (self._rows, CHUNK_BYTES))

    def cleanup(self) -> None:
        return


class PumpedLookups(val.AsyncLookupManager):
    """vLLM's AsyncLookupManager whose worker runs when the test pumps it, not in a thread."""

    _pumping = False

    def __init__(self, tier: ScriptedTier) -> None:
        self._owner = tier
        super().__init__(tier_type=tier.tier_type)

    def batch_lookup(self, keys, req_context):
        return [k in self._owner.keys for k in keys]

    def _worker(self) -> None:
        if self._pumping:
            super()._worker()

    def pump(self) -> None:
        self._lookup_queue.put(None)  # the worker's loop ends at the sentinel
        self._pumping = True
        try:
            self._worker()
        finally:
            self._pumping = False


class ScriptedTier(vtb.SecondaryTierManager):
    """A secondary tier whose jobs finish when the test says (vLLM's interface)."""

    medium = vbase.Medium.STORAGE

    def __init__(self, view, tier_type, detector, async_lookup, clock: Clock) -> None:
        super().__init__(None, view, tier_type, detector)
        self.keys: set[bytes] = set()
        self.in_flight: dict[int, object] = {}
        self.results: list = []
        self.clock = clock
        self.lookups = PumpedLookups(self) if async_lookup else None

    def lookup(self, key, req_context):
        if self.lookups is None:
            return vbase.LookupResult.HIT if key in self.keys else vbase.LookupResult.MISS
        found = self.lookups.lookup(key, req_context)
        if found is None:
            return vbase.LookupResult.RETRY
        return vbase.LookupResult.HIT if found else vbase.LookupResult.MISS

    def _submit(self, job) -> None:
        job.submit_time = self.clock.now  # the dataclass default reads the real clock
        self.in_flight[job.job_id] = job

    submit_store = _submit
    submit_load = _submit

    def finish(self, job_id: int, ok: bool = True, keep: int = 0) -> None:
        job = self.in_flight.pop(job_id)
        keys = list(job.keys)
        if not job.is_promotion:
            if ok:
                self.keys.update(keys)
            self.results.append(vtb.JobResult(job_id=job_id, success=ok))
            return
        readable = 0
        for key in keys:
            if key not in self.keys:
                break
            readable += 1
        if not ok:
            readable = min(readable, keep)
        if readable == len(keys):
            self.results.append(vtb.JobResult(job_id=job_id, success=True))
            return
        if self.lookups is not None:
            self.lookups.mark_miss(keys[readable:])
        kept = tuple(keys[:readable]) or None
        self.results.append(vtb.JobResult(job_id=job_id, success=False, successful_keys=kept))

    def get_finished_jobs(self):
        out, self.results = self.results, []
        return out

    def drain_jobs(self) -> None:
        for job_id in list(self.in_flight):
            self.finish(job_id)

    def on_new_request(self, req_context):
        return vbase.RequestOffloadingContext()

    def on_request_finished(self, req_context) -> None:
        if self.lookups is not None:
            self.lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context) -> None:
        if self.lookups is not None:
            self.lookups.flush()

    def shutdown(self) -> None:
        if self.lookups is not None:
            self.lookups.shutdown()


def _vllm_detector(spec: BackpressureSpec):
    policy = getattr(vbp, spec.policy)()
    return vbp.EMABackpressureDetector(
        policy=policy,
        high_water_s=spec.high_water_s,
        low_water_s=spec.low_water_s,
        alpha=spec.alpha,
        warmup_completions=spec.warmup_completions,
        decay_half_life_s=spec.decay_half_life_s,
        cooldown_s=spec.cooldown_s,
        failure_threshold=spec.failure_threshold,
    )


# --- the scenario ---


@dataclass
class TierPlan:
    tier_type: str  # "fs": existence checks answered a step later; "example": at once
    backpressure: BackpressureSpec | None


@dataclass
class Plan:
    num_chunks: int
    policy: str
    tiers: list[TierPlan]


def random_plan(rng: random.Random) -> Plan:
    tiers = []
    for _ in range(rng.choice((1, 1, 2))):
        bp = None
        if rng.random() < 0.6:
            high = rng.choice((0.5, 1.0, 2.0))
            bp = BackpressureSpec(
                policy=rng.choice(("ThrottledDropPolicy", "DropStorePolicy")),
                high_water_s=high,
                low_water_s=high * rng.choice((0.2, 0.5, 1.0)),
                alpha=rng.choice((0.15, 0.5, 1.0)),
                warmup_completions=rng.choice((1, 2, 3)),
                decay_half_life_s=rng.choice((0.0, 2.0, 5.0)),
                cooldown_s=rng.choice((0.0, 1.0, 4.0)),
                failure_threshold=rng.choice((None, 1, 2, 3)),
            )
        tiers.append(TierPlan(rng.choice(("fs", "example")), bp))
    return Plan(rng.randint(2, 10), rng.choice(("lru", "arc")), tiers)


@dataclass
class Req:
    req_id: str
    keys: list[int]
    kv: RequestContext
    vl: object
    phase: str = "lookup"  # lookup -> store -> done
    next_store: int = 0
    loads: list[list[int]] = field(default_factory=list)
    stores: list[tuple[list[int], bool]] = field(default_factory=list)
    finished: bool = False


class IdMap:
    """CPU slot ids on the two sides: equal until a partially failed promotion frees its
    lost slots in vLLM's set order (Python's bytes hash, random per process); consistent
    (one kvsim slot per vLLM slot at any time) always."""

    def __init__(self) -> None:
        self.exact = True
        self.to_kv: dict[int, int] = {}

    def allocate(self, vl_ids, kv_ids, where: str) -> None:
        vl_ids, kv_ids = [int(i) for i in vl_ids], [int(i) for i in kv_ids]
        if self.exact:
            assert vl_ids == kv_ids, where
        assert len(vl_ids) == len(kv_ids), where
        self.to_kv.update(zip(vl_ids, kv_ids))

    def use(self, vl_ids, kv_ids, where: str) -> None:
        vl_ids, kv_ids = [int(i) for i in vl_ids], [int(i) for i in kv_ids]
        if self.exact:
            assert vl_ids == kv_ids, where
        assert [self.to_kv.get(i) for i in vl_ids] == kv_ids, where


class Pair:
    """Both managers, driven identically, compared as they go."""

    def __init__(self, plan: Plan, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = clock = Clock()
        monkeypatch.setattr(vbp, "time", types.SimpleNamespace(monotonic=clock))
        primary = vtm.CPUPrimaryTierOffloadingManager(
            num_chunks=plan.num_chunks,
            mmap_region=_Region(plan.num_chunks),
            cache_policy=plan.policy,
        )
        view = primary.get_kv_memoryview()
        self.vl_tiers = [
            ScriptedTier(
                view,
                t.tier_type,
                None if t.backpressure is None else _vllm_detector(t.backpressure),
                t.tier_type == "fs",
                clock,
            )
            for t in plan.tiers
        ]
        self.vl = vtm.TieringOffloadingManager(primary, self.vl_tiers, tier_poll_interval_s=0)
        assert self.vl._tier_poll_thread is None

        kv_primary = PrimaryTier(
            plan.num_chunks, make_eviction_policy(plan.policy, plan.num_chunks)
        )
        self.kv_tiers = [
            SecondaryTier(
                TierSpec(type=t.tier_type, backpressure=t.backpressure),
                i,
                UnboundedStore(),
                None if t.backpressure is None else EMADetector(t.backpressure, clock),
                instant=False,
            )
            for i, t in enumerate(plan.tiers)
        ]
        self.kv = TieredManager(kv_primary, self.kv_tiers, chunk_bytes=CHUNK_BYTES, clock=clock)
        self.ids = IdMap()
        self.events: Counter[str] = Counter()
        self.vl_counters: Counter[tuple[str, str]] = Counter()
        self.seed = seed
        self.step = 0

    def where(self, what: str) -> str:
        return f"seed {self.seed} step {self.step}: {what}"

    # --- requests ---

    def new_request(self, req_id: str, keys: list[int]) -> Req:
        positions = {k: 16 * (i + 1) for i, k in enumerate(keys)}
        kv_ctx = self.kv.new_context(req_id, positions)
        vl_ctx = vbase.ReqContext(req_id=req_id)
        for k, pos in positions.items():
            vl_ctx.set_offload_key_position(vllm_key(k), pos)
        self.vl.on_new_request(vl_ctx)
        self.kv.on_new_request(kv_ctx)
        return Req(req_id, keys, kv_ctx, vl_ctx)

    def lookup(self, req: Req, key: int) -> LookupResult:
        got_vl = self.vl.lookup(vllm_key(key), req.vl)
        got_kv = self.kv.lookup(key, req.kv)
        assert got_vl.name == got_kv.name, self.where(f"lookup {key} for {req.req_id}")
        self.events[f"lookup_{got_kv.name}"] += 1
        return got_kv

    def scan(self, req: Req) -> int | None:
        """The connector's prefix scan: hits, or None while it must wait."""
        count, deferred = 0, False
        for key in req.keys:
            result = self.lookup(req, key)
            if result in (LookupResult.HIT, LookupResult.HIT_PENDING):
                count += 1
                deferred |= result is LookupResult.HIT_PENDING
            elif result is LookupResult.RETRY:
                deferred = True
            else:
                break
        return None if deferred else count

    def prepare_load(self, req: Req, keys: list[int]) -> None:
        vl_ids = self.vl.prepare_load([vllm_key(k) for k in keys], req.vl).block_ids
        kv_ids = self.kv.prepare_load(keys, req.kv)
        self.ids.use(vl_ids, kv_ids, self.where(f"prepare_load {keys}"))
        req.loads.append(keys)

    def complete_load(self, req: Req, keys: list[int]) -> None:
        self.vl.complete_load([vllm_key(k) for k in keys], req.vl)
        self.kv.complete_load(keys, req.kv)

    def prepare_store(self, req: Req, keys: list[int]) -> bool:
        vl_out = self.vl.prepare_store([vllm_key(k) for k in keys], req.vl)
        kv_out = self.kv.prepare_store(keys, req.kv)
        where = self.where(f"prepare_store {keys} for {req.req_id}")
        assert (vl_out is None) == (kv_out is None), where
        if kv_out is None:
            self.events["store_allocation_failure"] += 1
            return False
        assert [kvsim_key(k) for k in vl_out.keys_to_store] == kv_out.keys_to_store, where
        assert [kvsim_key(k) for k in vl_out.evicted_keys] == kv_out.evicted_keys, where
        self.ids.allocate(vl_out.store_spec.block_ids, kv_out.chunk_ids, where)
        if kv_out.keys_to_store:
            req.stores.append((kv_out.keys_to_store, True))
        return True

    def complete_store(self, req: Req, keys: list[int], success: bool) -> None:
        self.vl.complete_store([vllm_key(k) for k in keys], req.vl, success)
        self.kv.complete_store(keys, req.kv, success)

    def finish_request(self, req: Req) -> None:
        self.vl.on_request_finished(req.vl)
        self.kv.on_request_finished(req.kv)
        req.finished = True

    # --- tiers ---

    def compare_jobs(self) -> None:
        for t, (vl_tier, kv_tier) in enumerate(zip(self.vl_tiers, self.kv_tiers)):
            vl_jobs = list(vl_tier.in_flight.values())
            kv_jobs = kv_tier.in_flight
            where = self.where(f"jobs of tier {t}")
            assert [
                (j.job_id, j.is_promotion, [kvsim_key(k) for k in j.keys]) for j in vl_jobs
            ] == [(j.job_id, j.is_promotion, j.keys) for j in kv_jobs], where
            for vj, kj in zip(vl_jobs, kv_jobs):
                if vj.is_promotion:
                    self.ids.allocate(vj.chunk_ids, kj.chunk_ids, where)
                else:
                    self.ids.use(vj.chunk_ids, kj.chunk_ids, where)

    def finish_job(self, tier: int, job_id: int, ok: bool, keep: int) -> None:
        job = self.vl_tiers[tier].in_flight[job_id]
        kind = "promotion" if job.is_promotion else "cascade"
        self.vl_tiers[tier].finish(job_id, ok, keep)
        self.kv_tiers[tier].finish(job_id, ok=ok, keep=keep)
        if not ok:
            self.events[f"failed_{kind}"] += 1
            if job.is_promotion and 0 < keep < len(job.keys):
                self.ids.exact = False  # vLLM frees the lost slots in set order
                self.events["partial_promotion"] += 1
        else:
            self.events[f"finished_{kind}"] += 1

    def pump_lookups(self, tier: int) -> None:
        vl_lookups = self.vl_tiers[tier].lookups
        kv_lookups = self.kv_tiers[tier].lookups
        assert (vl_lookups is None) == (kv_lookups is None)
        if vl_lookups is not None and kv_lookups is not None:
            vl_lookups.pump()
            kv_lookups.answer()

    # --- steps and state ---

    def schedule_end(self, new_req_ids: list[str]) -> None:
        self.vl.on_schedule_end(
            vbase.ScheduleEndContext(new_req_ids=new_req_ids, preempted_req_ids=())
        )
        self.kv.on_schedule_end(new_req_ids)

    def reset(self) -> None:
        self.vl.reset_cache()
        self.kv.reset_cache()
        self.events["reset"] += 1

    def reset_flushed(self) -> None:
        self.vl.on_reset_flushed()
        self.kv.on_reset_flushed()

    def poll_stats(self) -> None:
        """Counters accumulate on both sides; gauges are compared as they are now."""
        stats = self.vl.get_stats()
        vl_gauges: dict[tuple[str, str], float] = {}
        if stats is not None:
            types_, values = stats.metric_sections()
            for name, series in values.items():
                if not name.startswith(PREFIX):
                    continue
                for labels, value in series.items():
                    key = (name, labels[0] if labels else "")
                    if types_[name] == "counter":
                        self.vl_counters[key] += value
                    elif types_[name] == "gauge":
                        vl_gauges[key] = value
        kv_counters, kv_gauges = self.kv.take_stats()
        where = self.where("metrics")
        assert {k: v for k, v in self.vl_counters.items() if v} == {
            k: v for k, v in kv_counters.items() if v
        }, where
        assert vl_gauges == kv_gauges, where
        for (name, _), value in kv_counters.items():
            if value and "backpressure" in name:
                self.events["backpressure_drop"] += 1
            if value and "allocation_failures" in name:
                self.events["promotion_allocation_failure"] += 1

    def compare_state(self, universe: range) -> None:
        where = self.where("contents")
        vl_primary = self.vl.primary_tier
        for key in universe:
            vl = vl_primary.lookup(vllm_key(key), None).name
            kv = self.kv.primary.lookup(key).name
            assert vl == kv, where + f" CPU key {key}"
        for t, (vl_tier, kv_tier) in enumerate(zip(self.vl_tiers, self.kv_tiers)):
            assert {kvsim_key(k) for k in vl_tier.keys} == {
                k for k in universe if kv_tier.store.contains(k)
            }, where + f" tier {t}"
        assert self.vl.has_pending_work() == self.kv.has_pending_work(), where
        assert vl_primary._num_evictable_cache_chunks == self.kv.primary.num_evictable, where
