"""The scheduler's named steps and its one token clamp, on small exact cases.

Blocks and units are 16 tokens, prefix caching is off and there is no connector, so each
case is the scheduler alone: which request gets how many tokens and blocks in one step.
"""

from __future__ import annotations

import itertools

import pytest

from kvsim.core.context import RequestContext
from kvsim.core.errors import InputError
from kvsim.engine.params import EngineParams
from kvsim.engine.request_state import RUNNING, WAITING, WAITING_FOR_KV, SimRequest
from kvsim.engine.scheduler import Scheduler, clamp_new_tokens
from kvsim.manager.gpu_cache import GpuBlockPool

UNIT = 16


def make_scheduler(
    *,
    budget: int = 8192,
    threshold: int = 0,
    blocks: int = 64,
    max_seqs: int = 256,
    chunked: bool = True,
) -> Scheduler:
    params = EngineParams(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        gpu_blocks=blocks,
        enable_prefix_caching=False,
        max_num_seqs=max_seqs,
        async_scheduling=False,
        enable_chunked_prefill=chunked,
    )
    return Scheduler(params, GpuBlockPool(blocks), UNIT, None)


def make_req(rid: int, prompt: int, output: int = 4) -> SimRequest:
    return SimRequest(rid, 0.0, prompt, output, [], [], RequestContext(rid))


def step(s: Scheduler, t: float = 0.0) -> dict[int, int]:
    """One schedule + update; returns rid -> tokens scheduled (as the forward saw them)."""
    s.schedule(t, 0)
    sched = {r.rid: r.sched for r in s.scheduled}
    s.update(t + 1.0)
    return sched


# --- clamp_new_tokens: the one clamp both loops use ---


@pytest.mark.parametrize(
    ("n", "budget", "threshold", "expected"),
    [
        (50, 100, 0, 50),  # threshold 0: off
        (50, 20, 0, 20),  # budget binds
        (50, 100, 30, 30),  # threshold binds
        (30, 100, 30, 30),  # n == threshold: untouched
        (29, 100, 30, 29),  # below threshold: untouched
        (50, 20, 30, 20),  # both bind: the smaller (budget) wins
        (50, 30, 20, 20),  # both bind: the smaller (threshold) wins
        (1, 100, 1, 1),  # a decode is never cut
        (1, 1, 0, 1),
        (2, 100, 1, 1),  # the smallest threshold cuts a 2-token chunk to 1
    ],
)
def test_clamp_small_cases(n: int, budget: int, threshold: int, expected: int) -> None:
    assert clamp_new_tokens(n, budget, threshold) == expected


def _old_running_clamp(n: int, budget: int, threshold: int) -> int:
    """The running loop's clamp before the refactor (scheduler.py line 105), verbatim."""
    if n > 1 and threshold and n > threshold:
        n = threshold
    if n > budget:
        n = budget
    return n


def _old_waiting_clamp(n: int, budget: int, threshold: int) -> int:
    """The waiting loop's clamp before the refactor (scheduler.py lines 170 and 201), verbatim."""
    if threshold and n > threshold:
        n = threshold
    if n > budget:
        n = budget
    return n


def test_old_clamps_agree_on_every_valid_input() -> None:
    """The running clamp's extra ``n > 1`` was redundant: with ``threshold >= 1``,
    ``n > threshold`` already implies ``n >= 2``, so one clamp serves both loops."""
    for n, budget, threshold in itertools.product(range(1, 40), range(1, 40), range(0, 40)):
        new = clamp_new_tokens(n, budget, threshold)
        assert _old_running_clamp(n, budget, threshold) == new
        assert _old_waiting_clamp(n, budget, threshold) == new


def test_old_clamps_differ_only_on_a_rejected_threshold() -> None:
    """They would split only on a negative threshold, which EngineParams (like vLLM's
    ``Field(ge=0)``) rejects."""
    assert _old_running_clamp(1, 100, -1) == 1
    assert _old_waiting_clamp(1, 100, -1) == -1
    with pytest.raises(InputError):
        EngineParams(long_prefill_token_threshold=-1)


# --- the clamp inside the steps ---


def test_waiting_loop_applies_threshold_then_budget() -> None:
    s = make_scheduler(budget=40, threshold=30)
    a, b, c = make_req(0, 50), make_req(1, 50), make_req(2, 50)
    s.waiting.extend([a, b, c])
    batch = s.schedule(0.0, 0)
    assert [(r.rid, r.sched) for r in s.scheduled] == [(0, 30), (1, 10)]  # budget left: 10
    assert (batch.prefill_tokens, batch.decode_tokens) == (40, 0)
    assert list(s.waiting) == [c] and c.status == WAITING
    assert [len(r.blocks) for r in (a, b)] == [2, 1]  # ceil(30/16), ceil(10/16)


def test_without_chunked_prefill_a_prompt_that_does_not_fit_the_budget_left_waits() -> None:
    """vLLM's waiting loop without chunked prefill: 0 takes 30 of 40 tokens; 1 (30) would
    need a split, so admission stops there, and 2 (5 tokens, it would fit) waits behind it
    in FCFS order. Next step the budget holds 1 whole beside 0's decode."""
    s = make_scheduler(budget=40, chunked=False)
    a, b, c = make_req(0, 30), make_req(1, 30), make_req(2, 5)
    s.waiting.extend([a, b, c])
    assert step(s) == {0: 30}
    assert list(s.waiting) == [b, c] and b.status == WAITING
    assert step(s) == {0: 1, 1: 30, 2: 5}  # 36 of 40


def test_without_chunked_prefill_the_threshold_still_cuts_a_long_prompt() -> None:
    """The long-prefill threshold applies before the budget test, as in vLLM: a 50-token
    prompt under a 30-token threshold is 30 new tokens, which fit a 40-token budget."""
    s = make_scheduler(budget=40, threshold=30, chunked=False)
    s.waiting.extend([make_req(0, 50), make_req(1, 50)])
    assert step(s) == {0: 30}  # 1's 30 exceed the 10 left: it waits whole
    assert step(s) == {0: 20}  # 30 > the 20 left again (chunked prefill would give it 20)
    assert step(s) == {0: 1, 1: 30}
    assert step(s) == {0: 1, 1: 20}  # a running request's next chunk is never held back


def test_running_loop_applies_threshold_then_budget() -> None:
    s = make_scheduler(budget=40, threshold=30)
    s.waiting.extend([make_req(0, 50), make_req(1, 50)])
    assert step(s) == {0: 30, 1: 10}
    # running first: 0 has 20 left (< threshold), 1 has 40 left -> threshold 30 -> budget 20
    assert step(s) == {0: 20, 1: 20}
    assert step(s) == {0: 1, 1: 20}  # 0 decodes; 1 finishes its prompt (20 left)


def test_running_decode_is_never_cut_and_counts_as_decode() -> None:
    s = make_scheduler(threshold=1)
    s.waiting.append(make_req(0, 3, output=6))
    assert step(s) == {0: 3}  # alone: the threshold does not apply (vLLM 0.33)
    s.waiting.append(make_req(1, 5, output=1))
    # two eligible: 0 decodes one token (never cut), 1 is cut to the threshold of 1
    assert [step(s) for _ in range(2)] == [{0: 1, 1: 1}] * 2
    batch = s.schedule(1.0, 0)
    assert [r.sched for r in s.scheduled] == [1, 1]
    assert (batch.decode_tokens, batch.prefill_tokens) == (1, 1)  # 0's token is a decode


def test_promoted_request_is_clamped_from_its_loaded_tokens() -> None:
    """A request whose async load landed resumes from its loaded tokens (the waiting loop's
    second branch): the clamp sees only what is left."""
    s = make_scheduler(budget=100, threshold=30)
    r = make_req(0, 100)
    r.blocks = s.pool.allocate(4)  # holds 64 loaded tokens
    r.status, r.pending_ext, r.load_done = WAITING_FOR_KV, 64, True
    s.waiting.extend([r, make_req(1, 10)])  # two eligible, so the threshold applies
    s.schedule(0.0, 0)
    assert (r.status, r.num_computed, r.sched) == (RUNNING, 64, 30)  # 36 left, cut to 30
    assert len(r.blocks) == 6  # ceil(94/16)


def test_growing_preempts_the_last_running_request() -> None:
    """No free block for a running request's next token: the tail of the running list loses
    its KV (recompute, back to the head of the queue) and nobody is admitted this step."""
    s = make_scheduler(blocks=4, max_seqs=2)
    a, b, c = make_req(0, 16, output=20), make_req(1, 16, output=20), make_req(2, 16)
    s.waiting.extend([a, b, c])
    assert step(s) == {0: 16, 1: 16}  # c waits for a seat (max_num_seqs=2)
    t = 1.0
    while True:  # decode until a needs its 3rd block: 2 + 2 blocks held, none free
        s.schedule(t, 0)
        if s.preempted:
            break
        s.update(t + 1.0)
        t += 1.0
    assert a.num_computed == 32 and len(a.blocks) == 3
    assert s.preempted == [b] and (b.status, b.num_computed, b.blocks) == (WAITING, 0, [])
    assert [r.rid for r in s.scheduled] == [0] and a.sched == 1
    assert list(s.waiting) == [b, c] and s.num_preemptions == 1


def test_lone_request_is_not_capped_as_in_vllm_033() -> None:
    # vLLM 0.33 scheduler.py: the threshold is 0 unless running + waiting > 1
    s = make_scheduler(budget=100, threshold=30)
    s.waiting.append(make_req(0, 50))
    s.schedule(0.0, 0)
    assert s.scheduled[0].sched == 50


# --- vLLM 0.33's admission rules: the full-prompt gate, holders first, reserved blocks ---


def test_full_prompt_gate_refuses_a_request_whose_prompt_cannot_all_fit() -> None:
    """scheduler_reserve_full_isl: a 100-token prompt (7 blocks) is not admitted with 6 free
    blocks even though its first chunk (threshold 16: one block) would fit."""
    s = make_scheduler(blocks=8, threshold=16)
    s.running.append(held := make_req(9, 32))
    held.blocks, held.num_computed, held.status = s.pool.allocate(2), 31, RUNNING
    s.waiting.append(r := make_req(0, 100))
    s.schedule(0.0, 0)
    assert r.status == WAITING and r.blocks == [] and [q.rid for q in s.scheduled] == [9]
    s2 = make_scheduler(blocks=9, threshold=16)  # 7 free: it fits, one chunk is taken
    s2.running.append(held2 := make_req(9, 32))
    held2.blocks, held2.num_computed, held2.status = s2.pool.allocate(2), 31, RUNNING
    s2.waiting.append(r2 := make_req(0, 100))
    s2.schedule(0.0, 0)
    assert (r2.status, r2.sched, len(r2.blocks)) == (RUNNING, 16, 1)


def test_requests_holding_blocks_are_tried_before_the_plain_queue() -> None:
    """vLLM drains kv_holding_waiting first: a request whose load landed is admitted ahead of
    an earlier arrival that holds nothing."""
    s = make_scheduler(blocks=8, max_seqs=1)
    s.waiting.append(plain := make_req(0, 16))
    loaded = make_req(1, 40)
    loaded.blocks = s.pool.allocate(2)
    loaded.status, loaded.pending_ext, loaded.load_done = WAITING_FOR_KV, 32, True
    s.kv_holding.append(loaded)
    s.schedule(0.0, 0)
    assert [r.rid for r in s.scheduled] == [1] and loaded.sched == 8
    assert list(s.waiting) == [plain] and not s.kv_holding


def test_prefills_in_flight_reserve_their_remaining_blocks() -> None:
    """An async-load admission must leave free what admitted prefills still need (vLLM
    reserved_blocks): a running 80-token prefill holding 1 of its 5 blocks reserves 4."""
    s = make_scheduler(blocks=8, threshold=16)
    s.waiting.append(a := make_req(0, 80))
    s.waiting.append(b := make_req(1, 48))
    s.schedule(0.0, 0)
    assert a in s.inflight_prefills and b in s.inflight_prefills  # both have prompt left
    assert s._remaining_blocks(a) == 4 and s._remaining_blocks(b) == 2
    s.update(1.0)
    # free: 8 - 2 held = 6, reserved 4 + 2 = 6 -> an async load needing one block must wait
    c = make_req(2, 40)
    assert not s._take_admission_blocks(c, 0, 16, True, 0)
    assert s._take_admission_blocks(c, 0, 16, False, 0)  # a sync admission is not held back


def test_a_prefill_leaves_the_reserve_when_its_last_chunk_is_scheduled() -> None:
    s = make_scheduler(blocks=16, threshold=16)
    s.waiting.extend([a := make_req(0, 32), make_req(1, 16)])
    step(s)
    assert a in s.inflight_prefills
    s.schedule(1.0, 0)  # a's second and last chunk
    assert a.sched == 16 and a not in s.inflight_prefills


def test_rescue_drops_the_kv_of_holders_behind_the_head() -> None:
    """Loaded requests that each wait for blocks another holds: the ones behind the head
    lose their KV (recompute) and go to the plain queue, so the head can be admitted."""
    s = make_scheduler(blocks=6)
    holders = []
    for rid in range(3):
        r = make_req(rid, 64)  # 4 blocks each to run; each holds 2
        r.blocks = s.pool.allocate(2)
        r.status, r.pending_ext, r.load_done = WAITING_FOR_KV, 32, True
        holders.append(r)
    s.kv_holding.extend(holders)
    s.schedule(0.0, 0)
    assert not s.scheduled  # the head needs 2 more blocks, none is free
    assert s.rescue()
    assert list(s.kv_holding) == holders[:1] and list(s.waiting) == holders[1:]
    assert all(r.blocks == [] and r.preemptions == 1 for r in holders[1:])
    s.schedule(1.0, 0)
    assert [r.rid for r in s.scheduled] == [0]


# --- admits_nothing: the certificate that lets quiet decode steps run while requests wait
# (kvsim.engine.quiet_decode); it must vouch exactly for the refusal the last schedule made,
# at the free-block count where that refusal flips, and for nothing it did not see ---


def _refusing() -> tuple[Scheduler, SimRequest]:
    """20 blocks: A (64 tokens, 4 blocks) runs; B (272 tokens, 17 blocks) finds 16 free."""
    s = make_scheduler(blocks=20)
    a, b = make_req(0, 64), make_req(1, 272)
    s.waiting.extend([a, b])
    s.schedule(0.0, 0)
    s.update(1.0)
    assert s.running == [a] and list(s.waiting) == [b]
    return s, b


def test_a_refused_head_is_vouched_for_below_the_blocks_it_needs_and_not_at_them() -> None:
    s, b = _refusing()
    assert s.refused is b and s.refused_blocks == 17
    assert s.admits_nothing(16) and s.admits_nothing(0)
    assert not s.admits_nothing(17)  # 17 free blocks admit it: the general path must run


def test_only_the_last_schedules_refusal_counts() -> None:
    s, b = _refusing()
    s.pool.free(s.running.pop().blocks)  # A leaves, its blocks free: B is admitted next
    s.schedule(1.0, 1)
    assert b in s.running and s.refused is None
    c = make_req(2, 16)
    s.waiting.append(c)  # a request the last schedule never tried
    assert not s.admits_nothing(0)


def test_a_head_in_front_of_the_refused_one_or_a_holder_of_blocks_is_not_vouched_for() -> None:
    s, _ = _refusing()
    d = make_req(3, 16)
    s.waiting.appendleft(d)  # as a preemption puts its victim
    assert not s.admits_nothing(0)
    s.waiting.popleft()
    assert s.admits_nothing(0)
    e = make_req(4, 16)
    e.status = WAITING_FOR_KV  # tried before the plain queue, and may be promoted
    s.kv_holding.append(e)
    assert not s.admits_nothing(0)


def test_nothing_waiting_or_every_sequence_slot_taken_admits_nothing() -> None:
    s = make_scheduler(blocks=20, max_seqs=1)
    assert s.admits_nothing(0)  # nobody waits
    s.waiting.extend([make_req(0, 16), make_req(1, 16)])
    s.schedule(0.0, 0)
    s.update(1.0)
    assert len(s.running) == 1 and s.refused is None  # the second was never tried
    assert s.admits_nothing(20)  # max_num_seqs: the general path would try no one
