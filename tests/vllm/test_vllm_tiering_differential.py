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
from collections import Counter

import pytest
from support import need_vllm

need_vllm("vllm.v1.kv_offload.tiering.manager")

from vllm_tiering_pair import Pair, Req, random_plan  # noqa: E402

pytestmark = pytest.mark.vllm

TRACES = 240
GROUPS = 8
STEPS = 70


class RandomTrace:
    """One random trace: the decisions are drawn here, once, and applied to both sides."""

    def __init__(self, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rng = rng = random.Random(seed)
        plan = random_plan(rng)
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
