"""Quiet decode steps: the scheduler's part of an async iteration in which nothing but the
clock and the decoders' token counts can change.

A fleet instance, or any lightly loaded engine, spends most of its steps with a few
requests that only decode: no arrival, no waiting request, no transfer, no new GPU block,
no block to cache, no chunk to offer, no finish. vLLM's ``schedule`` and
``update_from_output`` then do, per request, one token in flight and one token delivered;
everything around them (the batch queue, the connector's worker calls, the event queue)
does nothing. :meth:`kvsim.engine.engine.Engine._quiet_run` runs such an iteration
with the two functions here instead of the general ones, which earns its keep on the whole
command only where these steps dominate (``docs/speed.md``).

The contract, tested against the general path on random traces that reach every edge
(``tests/engine/test_engine_quiet_decode.py``): when :func:`quiet_decode_ready` says yes,
:func:`schedule_quiet` then :func:`update_quiet` leave every object exactly as
``Scheduler.schedule`` then ``Scheduler.update`` would, and return the same batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.engine.request_state import RUNNING, SimRequest
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.step_batch import StepBatch

Entry = tuple[SimRequest, int, bool]


def quiet_decode_ready(sched: Scheduler, processed: Sequence[Entry]) -> bool:
    """Whether scheduling the next step and then processing ``processed`` (the entries of
    the batch in flight) is quiet: every running request is scheduled one decode token that
    needs no new block, fills no block to cache and completes no chunk to offer; every
    processed entry delivers a token that neither is the request's first or last nor fills a
    block. No side effects.

    Args:
        sched: the async scheduler, its waiting queues and in-flight prefills empty (the
            caller checks the engine's and connector's part).
        processed: the entries of the batch processed after the schedule.
    """
    running = sched.running
    if (
        not running
        or sched.waiting
        or sched.kv_holding
        or sched.inflight_prefills
        or len(running) > sched.params.max_num_batched_tokens
    ):
        return False
    unit = sched.unit
    prefix = sched.prefix_caching
    conn = sched.connector
    tpc = conn.tpc if conn is not None else 1 << 62
    prompt_only = conn is None or conn.prompt_only
    for req in running:  # the schedule's clamp, block, cache and offer tests (see
        c = req.num_computed + req.in_flight  # Scheduler._schedule_running)
        placeholders = req.placeholders
        prompt = req.prompt
        if c < prompt or (placeholders and c + 2 - placeholders >= prompt + req.output):
            return False
        num_tokens = prompt + req.num_output
        if num_tokens + placeholders - c != 1:
            return False
        end = c + 1
        if end > len(req.blocks) * unit or (prefix and end // unit > req.n_cached):
            return False
        first = req.next_store
        if (not prompt_only or first < req.n_prompt_chunks) and (
            end if end < num_tokens else num_tokens
        ) // tpc > first:
            return False
    for req, n, sampled in processed:  # Scheduler.update's tests, after the schedule
        if (
            n != 1
            or not sampled
            or req.status != RUNNING
            or req.stale
            or req.num_output < 1
            or req.num_output + 1 >= req.output
            or (prefix and (req.num_computed + 1) // unit > req.n_cached)
        ):
            return False
    return True


def schedule_quiet(sched: Scheduler) -> StepBatch:
    """``Scheduler.schedule`` of a quiet step (after :func:`quiet_decode_ready`): one decode
    token for each running request, in order; returns the step's batch. The connector's
    scheduler-side calls are the caller's."""
    sched.open_step(len(sched.running))
    seq = sched.step_seq
    decode = context = 0
    pairs = 0.0
    reqs: list[SimRequest] = []
    entries: list[Entry] = []
    for req in sched.running:
        c = req.num_computed + req.in_flight
        req.sched = 1
        reqs.append(req)
        decode += 1
        context += c
        pairs += c + 1.0
        req.in_flight += 1
        req.last_seq = seq
        req.placeholders += 1
        entries.append((req, 1, True))
    sched.scheduled = reqs
    sched.close_step(True, entries)
    return StepBatch(decode, 0, 0, decode, context, pairs, context)


def update_quiet(processed: Sequence[Entry], t_end: float) -> None:
    """``Scheduler.update`` of a quiet batch whose forward ended at ``t_end``: each request's
    token is computed and delivered (no first token, no finish, no block to cache)."""
    for req, _, _ in processed:
        req.num_computed += 1
        req.in_flight -= 1
        req.forward_tokens += 1
        req.num_output += 1
        req.token_gaps.append(t_end - req.last_token)
        req.last_token = t_end
        req.placeholders -= 1
