"""The event heap's tie-break and the clocks."""

from __future__ import annotations

from kvsim.engine.clock import MonotonicClock, VirtualClock
from kvsim.engine.events import PHASE_ARRIVAL, PHASE_STEP, PHASE_TRANSFER, EventQueue


def test_order_is_time_then_phase_then_insertion():
    q = EventQueue()
    q.push(2.0, PHASE_ARRIVAL, "late arrival")
    q.push(1.0, PHASE_STEP, "step")
    q.push(1.0, PHASE_ARRIVAL, "arrival a")
    q.push(1.0, PHASE_TRANSFER, "transfer")
    q.push(1.0, PHASE_ARRIVAL, "arrival b")
    q.push(0.5, PHASE_STEP, "early step")
    assert q.peek_time() == 0.5
    order = [q.pop()[2] for _ in range(len(q))]
    assert order == ["early step", "transfer", "arrival a", "arrival b", "step", "late arrival"]
    assert not q


def test_payloads_are_never_compared():
    q = EventQueue()
    q.push(1.0, PHASE_STEP, {"a": 1})
    q.push(1.0, PHASE_STEP, {"b": 2})  # dicts are not orderable; the sequence decides
    assert [q.pop()[2] for _ in range(2)] == [{"a": 1}, {"b": 2}]


def test_virtual_clock_jumps_forward_only():
    c = VirtualClock()
    c.wait_until(3.5)
    c.wait_until(1.0)
    assert c.now() == 3.5


def test_monotonic_clock_sleeps():
    c = MonotonicClock()
    t = c.now() + 0.02
    c.wait_until(t)
    assert c.now() >= t
