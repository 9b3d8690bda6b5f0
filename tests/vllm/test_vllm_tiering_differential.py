"""Differential test: kvsim's tiering manager against vLLM 0.33's own
``TieringOffloadingManager``, step by step, on random traces.

vLLM's side is its real orchestrator over its real CPU primary tier
(``CPUPrimaryTierOffloadingManager``), with a secondary tier whose jobs finish when the
test says (:class:`ScriptedTier`, a ``SecondaryTierManager``), vLLM's own
``AsyncLookupManager`` for existence checks (its worker run by the test instead of a
thread), and vLLM's own ``EMABackpressureDetector`` with its drop policies on a clock the
test moves. The tier-poll thread is off. kvsim's side is :class:`kvsim.tiering.TieredManager`
with kvsim's CPU manager, :class:`kvsim.tiering.secondary.SecondaryTier` (``instant=False``:
jobs finish when told), kvsim's async lookups and detector on the same clock.

Every step both sides get the same calls: new requests; connector-style prefix scans
(every lookup result compared); loads of settled hits; store offers (keys, evictions and
chunk ids compared) and their completions, some failed; request finishes, some before
their stores complete; per tier, in-flight jobs left running, finished, failed, or failed
after some chunks (the submitted jobs compared: ids, direction, keys, CPU slots); the
existence-check worker run or not; the clock moved; stats polled; the step ended; now and
then ``reset_cache``. After every step the CPU tier's and the secondary tiers' contents,
the pending work and every ``vllm:kv_offload_tiering_*`` counter and gauge are compared.
"""

from __future__ import annotations

import random
import types
from collections import Counter
from dataclasses import dataclass, field

import pytest
from support import need_vllm

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

pytestmark = pytest.mark.vllm

CHUNK_BYTES = 1 << 20  # 1 MiB: the detector's seconds per MiB are the job's seconds per chunk
TRACES = 240
GROUPS = 8
STEPS = 70


def enc(key: int) -> bytes:
    return key.to_bytes(8, "big") + b"\0\0\0\0"


def dec(key: bytes) -> int:
    return int.from_bytes(key[:8], "big")


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


def _plan(rng: random.Random) -> Plan:
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
            vl_ctx.set_offload_key_position(enc(k), pos)
        self.vl.on_new_request(vl_ctx)
        self.kv.on_new_request(kv_ctx)
        return Req(req_id, keys, kv_ctx, vl_ctx)

    def lookup(self, req: Req, key: int) -> LookupResult:
        got_vl = self.vl.lookup(enc(key), req.vl)
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
        vl_ids = self.vl.prepare_load([enc(k) for k in keys], req.vl).block_ids
        kv_ids = self.kv.prepare_load(keys, req.kv)
        self.ids.use(vl_ids, kv_ids, self.where(f"prepare_load {keys}"))
        req.loads.append(keys)

    def complete_load(self, req: Req, keys: list[int]) -> None:
        self.vl.complete_load([enc(k) for k in keys], req.vl)
        self.kv.complete_load(keys, req.kv)

    def prepare_store(self, req: Req, keys: list[int]) -> bool:
        vl_out = self.vl.prepare_store([enc(k) for k in keys], req.vl)
        kv_out = self.kv.prepare_store(keys, req.kv)
        where = self.where(f"prepare_store {keys} for {req.req_id}")
        assert (vl_out is None) == (kv_out is None), where
        if kv_out is None:
            self.events["store_allocation_failure"] += 1
            return False
        assert [dec(k) for k in vl_out.keys_to_store] == kv_out.keys_to_store, where
        assert [dec(k) for k in vl_out.evicted_keys] == kv_out.evicted_keys, where
        self.ids.allocate(vl_out.store_spec.block_ids, kv_out.chunk_ids, where)
        if kv_out.keys_to_store:
            req.stores.append((kv_out.keys_to_store, True))
        return True

    def complete_store(self, req: Req, keys: list[int], success: bool) -> None:
        self.vl.complete_store([enc(k) for k in keys], req.vl, success)
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
            assert [(j.job_id, j.is_promotion, [dec(k) for k in j.keys]) for j in vl_jobs] == [
                (j.job_id, j.is_promotion, j.keys) for j in kv_jobs
            ], where
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
            vl = vl_primary.lookup(enc(key), None).name
            kv = self.kv.primary.lookup(key).name
            assert vl == kv, where + f" CPU key {key}"
        for t, (vl_tier, kv_tier) in enumerate(zip(self.vl_tiers, self.kv_tiers)):
            assert {dec(k) for k in vl_tier.keys} == {
                k for k in universe if kv_tier.store.contains(k)
            }, where + f" tier {t}"
        assert self.vl.has_pending_work() == self.kv.has_pending_work(), where
        assert vl_primary._num_evictable_cache_chunks == self.kv.primary.num_evictable, where


class RandomTrace:
    """One random trace: the decisions are drawn here, once, and applied to both sides."""

    def __init__(self, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rng = rng = random.Random(seed)
        plan = _plan(rng)
        self.pair = Pair(plan, seed, monkeypatch)
        self.universe = range(1, 3 * plan.num_chunks + 4)
        self.documents = [rng.sample(self.universe, rng.randint(2, 6)) for _ in range(4)]
        self.live: list[Req] = []
        self.next_req = 0

    def arrive(self) -> None:
        """A new request: a shared document's prefix and a tail of its own."""
        rng = self.rng
        if rng.random() < 0.5 and len(self.live) < 4:
            doc = rng.choice(self.documents)
            keys = doc[: rng.randint(1, len(doc))]
            tail = [k for k in rng.sample(self.universe, rng.randint(0, 3)) if k not in keys]
            self.live.append(self.pair.new_request(f"r{self.next_req}", keys + tail))
            self.next_req += 1

    def look_up(self, req: Req) -> bool:
        """The request's scan; True when it settles (the request is scheduled)."""
        hits = self.pair.scan(req)
        if hits is None:
            return False
        if hits:
            self.pair.prepare_load(req, req.keys[:hits])
        req.next_store = hits
        req.phase = "store"
        return True

    def store(self, req: Req) -> None:
        """Offer the next chunks, complete a load or a store (some fail), maybe finish."""
        rng, pair = self.rng, self.pair
        if req.next_store < len(req.keys) and rng.random() < 0.7:
            upto = min(len(req.keys), req.next_store + rng.randint(1, 3))
            if pair.prepare_store(req, req.keys[req.next_store : upto]):
                req.next_store = upto
        if req.loads and rng.random() < 0.6:
            pair.complete_load(req, req.loads.pop(0))
        if req.stores and rng.random() < 0.6:
            keys, _ = req.stores.pop(0)
            ok = rng.random() < 0.85
            pair.complete_store(req, keys, ok)
            if not ok:
                pair.events["failed_primary_store"] += 1
        if req.next_store >= len(req.keys) and not req.loads and rng.random() < 0.7:
            pair.finish_request(req)

    def run_tiers(self) -> None:
        """Each running job is left, finished, failed, or failed after some chunks; the
        existence-check workers run or not."""
        rng, pair = self.rng, self.pair
        pair.compare_jobs()
        for t, tier in enumerate(pair.vl_tiers):
            for job_id, job in list(tier.in_flight.items()):
                roll = rng.random()
                if roll < 0.3:
                    continue
                ok = roll < 0.82
                pair.finish_job(t, job_id, ok, 0 if ok else rng.randint(0, len(job.keys)))
            if rng.random() < 0.7:
                pair.pump_lookups(t)

    def step(self) -> None:
        rng, pair = self.rng, self.pair
        self.arrive()
        scheduled = []
        for req in self.live:
            if req.phase == "lookup":
                if rng.random() < 0.85 and self.look_up(req):
                    scheduled.append(req.req_id)
            elif not req.finished:
                self.store(req)
            elif req.stores and rng.random() < 0.6:
                keys, _ = req.stores.pop(0)  # a store completing after its request finished
                pair.complete_store(req, keys, True)
        self.live = [r for r in self.live if not (r.finished and not r.stores)]
        self.run_tiers()
        pair.clock.now += rng.choice((0.0, 0.1, 0.5, 1.0, 3.0))
        pair.poll_stats()
        pair.schedule_end(scheduled)
        pair.compare_state(self.universe)

    def reset(self) -> None:
        self.pair.reset()
        for req in self.live:  # vLLM never completes a transfer from before a reset
            req.loads.clear()
            req.stores.clear()
        self.live = [r for r in self.live if not r.finished]
        self.pair.compare_state(self.universe)

    def wind_down(self) -> None:
        """Every job finishes; the final contents and counters agree."""
        pair = self.pair
        pair.step = STEPS
        pair.compare_jobs()
        for t, tier in enumerate(pair.vl_tiers):
            for job_id in list(tier.in_flight):
                pair.finish_job(t, job_id, True, 0)
        pair.poll_stats()
        pair.schedule_end([])
        pair.compare_state(self.universe)


def run_trace(seed: int, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """One random trace through both managers; the events it reached."""
    trace = RandomTrace(seed, monkeypatch)
    pair = trace.pair
    try:
        reset_pending = False
        for step in range(STEPS):
            pair.step = step
            if reset_pending:
                pair.reset_flushed()
                reset_pending = False
            trace.step()
            if trace.rng.random() < 0.03:
                trace.reset()
                reset_pending = True
        trace.wind_down()
    finally:
        for tier in pair.vl_tiers:
            tier.shutdown()
    return pair.events


_ALL_EVENTS: Counter[str] = Counter()


@pytest.mark.parametrize("group", range(GROUPS))
def test_kvsim_tiering_makes_vllms_decisions(group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    per_group = TRACES // GROUPS
    for seed in range(group * per_group, (group + 1) * per_group):
        _ALL_EVENTS.update(run_trace(seed, monkeypatch))


#: what the random traces must reach for the comparison to mean something
GUARDED = (
    "lookup_HIT",
    "lookup_HIT_PENDING",
    "lookup_RETRY",
    "lookup_MISS",
    "finished_promotion",
    "finished_cascade",
    "failed_promotion",
    "partial_promotion",
    "failed_cascade",
    "backpressure_drop",
    "promotion_allocation_failure",
    "store_allocation_failure",
    "failed_primary_store",
    "reset",
)


def test_the_random_traces_reach_promotion_retry_drops_and_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guard: the compared traces exercise every path that matters (the first 40 are
    re-run here so the guard holds however the tests are selected)."""
    events: Counter[str] = Counter()
    for seed in range(40):
        events.update(run_trace(seed, monkeypatch))
    missing = [name for name in GUARDED if not events[name]]
    assert not missing, f"never reached: {missing} ({dict(events)})"
    if _ALL_EVENTS:
        missing = [name for name in GUARDED if not _ALL_EVENTS[name]]
        assert not missing, f"the {TRACES} traces never reached: {missing}"
