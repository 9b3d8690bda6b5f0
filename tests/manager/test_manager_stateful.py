"""Hypothesis state machines: the offload manager's invariants under every registered policy.

A simple model (key -> pending / ready with a pin count) shadows the manager. After every
step: capacity is never exceeded, pinned (ref>0) and pending (-1) chunks and the offered
keys are never evicted, a None from prepare_store changes nothing (same resident set and
policy order), the counters match the model, and lookups match the model.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.core.context import RequestContext
from kvsim.manager.offload import LookupResult, OffloadManager
from kvsim.policies.registry import EVICTION_POLICIES, make_admission, make_eviction_policy

CAPACITY = 4
PREFIXES = [[p * 10 + i for i in range(5)] for p in range(1, 4)]
UNIVERSE = [k for prefix in PREFIXES for k in prefix]


def policy_order(policy) -> list:
    """The most ordered view of the policy's state that the policy offers."""
    order = getattr(policy, "eviction_order", None)
    return list(order()) if callable(order) else list(policy.keys())


class ManagerMachine(RuleBasedStateMachine):
    policy_name = "lru"

    @initialize(threshold=st.sampled_from([0, 2]))
    def setup(self, threshold):
        admission = (
            make_admission(store_threshold=threshold, max_tracker_size=6) if threshold else None
        )
        self.m = OffloadManager(
            CAPACITY, make_eviction_policy(self.policy_name, CAPACITY), admission
        )
        self.model: dict[int, int] = {}  # key -> ref_cnt (-1 pending, 0 ready, >0 pinned)
        self.requests: list[tuple[RequestContext, list[int]]] = []
        self.store_jobs: list[list[int]] = []
        self.load_jobs: list[list[int]] = []
        self.n = 0

    @rule(
        prefix=st.sampled_from(range(len(PREFIXES))),
        length=st.integers(1, 5),
        positioned=st.booleans(),
    )
    def new_request(self, prefix, length, positioned):
        keys = PREFIXES[prefix][:length]
        ctx = RequestContext(
            self.n, {k: (i + 1) * 16 for i, k in enumerate(keys)} if positioned else {}
        )
        self.n += 1
        self.m.on_new_request(ctx)
        self.requests.append((ctx, keys))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def prepare_store(self, data):
        ctx, keys = data.draw(st.sampled_from(self.requests))
        lo = data.draw(st.integers(0, len(keys) - 1))
        offer = keys[lo : data.draw(st.integers(lo + 1, len(keys)))]
        before_keys = set(self.m.policy.keys())
        out = self.m.prepare_store(offer, ctx)
        if out is None:
            # nothing stored or evicted; the request's access is still recorded (as in vLLM,
            # before its early return), so recency may move but the resident set may not
            assert set(self.m.policy.keys()) == before_keys
            return
        for key in out.evicted_keys:
            assert self.model.get(key) == 0, f"evicted {key} with ref {self.model.get(key)}"
            assert key not in offer
            del self.model[key]
        for key in out.keys_to_store:
            assert key not in self.model and key in offer
            self.model[key] = -1
        assert len(out.chunk_ids) == len(out.keys_to_store)
        if out.keys_to_store:
            self.store_jobs.append(list(out.keys_to_store))

    @precondition(lambda self: self.store_jobs)
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data, success):
        job = self.store_jobs.pop(data.draw(st.integers(0, len(self.store_jobs) - 1)))
        self.m.complete_store(job, success=success)
        for key in job:
            if self.model.get(key) == -1:
                if success:
                    self.model[key] = 0
                else:
                    del self.model[key]

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def load_prefix(self, data):
        ctx, keys = data.draw(st.sampled_from(self.requests))
        hits = []
        for key in keys:
            if self.m.lookup(key) != LookupResult.HIT:
                break
            hits.append(key)
        if hits:
            ids = self.m.prepare_load(hits, ctx)
            assert len(set(ids)) == len(hits)
            for key in hits:
                self.model[key] += 1
            self.load_jobs.append(hits)

    @precondition(lambda self: self.load_jobs)
    @rule(data=st.data())
    def complete_load(self, data):
        job = self.load_jobs.pop(data.draw(st.integers(0, len(self.load_jobs) - 1)))
        self.m.complete_load(job)
        for key in job:
            self.model[key] -= 1

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish(self, data):
        i = data.draw(st.integers(0, len(self.requests) - 1))
        ctx, _ = self.requests.pop(i)
        self.m.on_request_finished(ctx)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def touch(self, data):
        ctx, keys = data.draw(st.sampled_from(self.requests))
        self.m.touch(data.draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)), ctx)

    @rule()
    def reset(self):
        self.m.reset_cache()
        self.model.clear()
        self.store_jobs.clear()
        self.load_jobs.clear()

    @invariant()
    def counters_and_lookups_match_model(self):
        if not hasattr(self, "m"):
            return
        m, model = self.m, self.model
        assert m.num_resident == len(model) <= CAPACITY
        assert len(m.policy) == len(model) and set(m.policy.keys()) == set(model)
        assert m.num_evictable == sum(1 for r in model.values() if r == 0)
        assert m.num_write_pending == sum(1 for r in model.values() if r == -1)
        for key in UNIVERSE:
            ref = model.get(key)
            expected = (
                LookupResult.MISS
                if ref is None
                else LookupResult.HIT_PENDING
                if ref < 0
                else LookupResult.HIT
            )
            assert m.lookup(key) == expected, key
            if ref is not None:
                assert m.policy.get(key).ref_cnt == ref


SETTINGS = settings(
    max_examples=50, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)


def _machine_for(name: str):
    machine = type(f"ManagerMachine_{name}", (ManagerMachine,), {"policy_name": name})
    case = machine.TestCase
    case.settings = SETTINGS
    return case


# one TestCase per registered policy (lru and arc first; new policies join automatically)
for _name in sorted(EVICTION_POLICIES, key=lambda n: (n not in ("lru", "arc"), n)):
    globals()[f"TestManager_{_name.replace('-', '_')}"] = _machine_for(_name)
