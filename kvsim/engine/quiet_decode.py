"""Quiet decode steps: the scheduler's part of an async iteration in which nothing but the
clock, the decoders' token counts and their GPU blocks can change.

A fleet instance, or any lightly loaded engine, spends most of its steps with a few
requests that only decode: no arrival, no admission, no copy to submit, no chunk to offer,
no finish; now and then a decoder takes a new GPU block or fills one, which is cached. An
overloaded engine spends many of its steps so too, with requests waiting: the queue's head
was refused for want of GPU blocks and stays refused while the blocks only shrink
(``Scheduler.admits_nothing``), or the running requests fill ``max_num_seqs``; store copies
may be in flight (polled at each launch, completed as their batch is processed).
vLLM's ``schedule`` and ``update_from_output`` then do, per request, one token in flight
and one token delivered; everything around them (the batch queue, the connector's worker
calls, the event queue) does nothing. :func:`kvsim.engine.quiet_loop.quiet_run` runs such
an iteration with the two functions here instead of the general ones, and a run of them
at once (:func:`steady_decode_steps` counts it, :class:`DecodeRunBlocks` does its
block work at the iterations it falls in, :func:`advance_decoders` moves the requests),
which earns its keep on the whole command only where these steps dominate
(``docs/speed.md``).

The contract, tested against the general path on random traces that reach every edge
(``tests/engine/test_engine_quiet_decode.py``): when :func:`quiet_decode_ready` says yes,
:func:`schedule_quiet` then :func:`update_quiet` leave every object exactly as
``Scheduler.schedule`` then ``Scheduler.update`` would, and return the same batch; ``k``
such iterations counted by :func:`steady_decode_steps`, with :class:`DecodeRunBlocks`'
block work, leave them as :func:`advance_decoders` does.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from itertools import islice
from typing import cast

from kvsim.engine.request_state import RUNNING, SimRequest
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.step_batch import StepBatch

Entry = tuple[SimRequest, int, bool]

_new_batch = tuple.__new__


def quiet_decode_ready(sched: Scheduler, processed: Sequence[Entry]) -> bool:
    """Whether scheduling the next step and then processing ``processed`` (the entries of
    the batch in flight) is quiet: every running request is scheduled one decode token that
    completes no chunk to offer, and the free GPU blocks cover the new blocks these tokens
    need (so none is preempted) and leave no waiting request admitted
    (``Scheduler.admits_nothing``); every processed entry delivers a token that is neither
    the request's first nor its last. A token may fill a block, which is then cached, as in
    the general path. No side effects.

    Args:
        sched: the async scheduler (the caller checks the engine's and connector's part:
            every step since the last ``Scheduler.schedule`` was quiet, the connector
            queues nothing).
        processed: the entries of the batch processed after the schedule.
    """
    running = sched.running
    if not running or sched.inflight_prefills or len(running) > sched.params.max_num_batched_tokens:
        return False
    unit = sched.unit
    conn = sched.connector
    tpc = conn.tpc if conn is not None else 1 << 62
    prompt_only = conn is None or conn.prompt_only
    grow = 0  # new GPU blocks the schedule takes
    for req in running:  # the schedule's clamp, block and offer tests (see
        c = req.num_computed + req.in_flight  # Scheduler._schedule_running)
        placeholders = req.placeholders
        prompt = req.prompt
        if c < prompt or (placeholders and c + 2 - placeholders >= prompt + req.output):
            return False
        num_tokens = prompt + req.num_output
        if num_tokens + placeholders - c != 1:
            return False
        end = c + 1
        if end > len(req.blocks) * unit:
            grow += new_blocks(req, end, unit)
        first = req.next_store
        if (not prompt_only or first < req.n_prompt_chunks) and (
            end if end < num_tokens else num_tokens
        ) // tpc > first:
            return False
    free = sched.pool.num_free - grow
    if free < 0 or not sched.admits_nothing(free):
        return False
    for req, n, sampled in processed:  # Scheduler.update's tests, after the schedule
        if (
            n != 1
            or not sampled
            or req.status != RUNNING
            or req.stale
            or req.num_output < 1
            or req.num_output + 1 >= req.output
        ):
            return False
    return True


def schedule_quiet(sched: Scheduler) -> StepBatch:
    """``Scheduler.schedule`` of a quiet step (after :func:`quiet_decode_ready`): one decode
    token for each running request, in order, its new block taken and its full blocks
    cached as the general path does; returns the step's batch. The connector's
    scheduler-side calls are the caller's."""
    sched.open_step(len(sched.running) + sched.num_waiting)
    seq = sched.step_seq
    unit = sched.unit
    prefix = sched.prefix_caching
    decode = context = 0
    reqs: list[SimRequest] = []
    entries: list[Entry] = []
    for req in sched.running:
        c = req.num_computed + req.in_flight
        end = c + 1
        if end > len(req.blocks) * unit or (prefix and end // unit > req.n_cached):
            take_blocks(sched, req, end)
        req.sched = 1
        reqs.append(req)
        decode += 1
        context += c
        req.in_flight += 1
        req.last_seq = seq
        req.placeholders += 1
        entries.append((req, 1, True))
    sched.scheduled = reqs
    sched.close_step(True, entries)
    return quiet_batch(decode, context)


def quiet_batch(seqs: int, context: int) -> StepBatch:
    """The batch of a quiet step: one decode token for each of ``seqs`` requests whose
    computed and in-flight tokens sum to ``context`` (each reads them and attends over them
    plus its new token). Made by ``tuple.__new__``, in C: the named tuple's own ``__new__``
    is a Python function, and a decode run makes one of these every iteration (for a time
    model without ``decode_seconds``, as the bench's linear one is)."""
    return _new_batch(StepBatch, (seqs, 0, 0, seqs, context, float(context + seqs), context))


def decode_step_seconds(compute: Callable[[StepBatch], float], seqs: int) -> Callable[[int], float]:
    """The forward time of :func:`quiet_batch` ``(seqs, context)`` as a function of
    ``context``: the compute model's own ``decode_seconds(seqs)`` when it has one (it must
    give the same seconds, bit for bit, as calling it on the batch: a test), else the batch
    made and timed."""
    fast = getattr(compute, "decode_seconds", None)
    if fast is not None:
        return fast(seqs)
    return lambda context: compute(quiet_batch(seqs, context))


def new_blocks(req: SimRequest, end: int, unit: int) -> int:
    """GPU blocks ``req`` lacks to hold ``end`` tokens (``Scheduler.grow_or_preempt``'s
    need for a decode token ending at ``end``)."""
    return max(0, -(-end // unit) - len(req.blocks))


def take_blocks(sched: Scheduler, req: SimRequest, end: int) -> None:
    """A quiet step's block work for ``req``, scheduled one token ending at ``end``: its
    new block taken (never failing: the callers checked the free blocks) and its full blocks
    cached, as ``Scheduler._schedule_running`` does."""
    if end > len(req.blocks) * sched.unit:
        sched.grow_or_preempt(req, 1)
    if sched.prefix_caching and end // sched.unit > req.n_cached:
        sched.cache_upto(req, end)


def next_block_event(req: SimRequest, computed: int, unit: int, prefix: bool, earliest: int) -> int:
    """The first iteration of a decode run, from ``earliest`` on, in which ``req`` has
    :func:`take_blocks` work: iteration ``j`` schedules a token ending at ``computed + j +
    2`` (``computed``: its computed tokens at the run's start), which needs a new block past
    its blocks' end and, with prefix caching, asks to cache once past its cached blocks."""
    event = len(req.blocks) * unit - computed - 1
    if prefix:
        fill = (req.n_cached + 1) * unit - computed - 2
        event = fill if fill < event else event
    return event if event > earliest else earliest


class DecodeRunBlocks:
    """The decoders' block work through a decode run
    (:func:`kvsim.engine.quiet_loop.decode_run`), iteration by iteration: which requests
    take a new block or cache a full one in iteration ``j`` (:func:`next_block_event`, in
    running order, as ``Scheduler._schedule_running`` meets them), whether the free blocks
    cover it, and the work itself. The requests' counts are the run's start values outside
    :meth:`work`; inside it they are iteration ``j``'s, which the block keys and the cache
    read.

    Args:
        sched: the scheduler in the steady state (:func:`steady_decode_steps`).
        steps: the iterations the run may take.
    """

    def __init__(self, sched: Scheduler, steps: int) -> None:
        self.sched, self.steps = sched, steps
        self.running = sched.running
        self.computed = [r.num_computed for r in self.running]
        self.outputs = [r.num_output for r in self.running]
        self._events: dict[int, list[int]] = {}  # iteration -> indexes into running
        for i in range(len(self.running)):
            self._plan(i, 0)

    def _plan(self, i: int, earliest: int) -> None:
        s = self.sched
        j = next_block_event(self.running[i], self.computed[i], s.unit, s.prefix_caching, earliest)
        if j < self.steps:
            self._events.setdefault(j, []).append(i)

    def due(self, j: int) -> list[int] | None:
        """The requests (indexes, running order) with block work in iteration ``j``."""
        due = self._events.pop(j, None)
        if due is not None:
            due.sort()
        return due

    def fits(self, due: list[int], j: int) -> bool:
        """Whether the free GPU blocks cover iteration ``j``'s new blocks (else the
        general path preempts: :func:`quiet_decode_ready` says no)."""
        running, computed, unit = self.running, self.computed, self.sched.unit
        need = 0
        for i in due:  # new_blocks, inlined (a run checks every iteration with block work)
            lack = -(-(computed[i] + j + 2) // unit) - len(running[i].blocks)
            if lack > 0:
                need += lack
        return need <= self.sched.pool.num_free

    def work(self, due: list[int], j: int) -> None:
        """Iteration ``j``'s block work, at its schedule, in running order: :func:`take_blocks`
        for a token ending at ``end``, with the request at iteration ``j``'s counts, written
        out on them (a decode run has thousands of these events; setting and restoring the
        request's counts around the calls cost more than the work)."""
        sched, running, computed, outputs = self.sched, self.running, self.computed, self.outputs
        unit, pool, conn = sched.unit, sched.pool, sched.connector
        prefix = sched.prefix_caching
        for i in due:
            req = running[i]
            end = computed[i] + j + 2
            # Scheduler.grow_or_preempt for one token in flight and one more, which never
            # preempts here (:meth:`fits` said the free blocks cover it)
            need = -(-end // unit) - len(req.blocks)
            if need > 0:
                blocks = cast("list[int]", pool.allocate(need))
                if conn is not None:
                    conn.on_allocate(blocks)
                req.blocks.extend(blocks)
            if prefix:  # Scheduler.cache_upto at num_output outputs[i] + j
                tokens = req.prompt + outputs[i] + j
                n = (end if end < tokens else tokens) // unit
                done = req.n_cached
                if n > done:
                    keys = sched._block_keys(req, n)
                    pool.cache_blocks(req.blocks[done:n], keys[done:n])
                    req.n_cached = n
            self._plan(i, j + 1)


def update_quiet(sched: Scheduler, processed: Sequence[Entry], t_end: float) -> None:
    """``Scheduler.update`` of a quiet batch whose forward ended at ``t_end``: each request's
    token is computed and delivered (no first token, no finish); a block it fills is
    cached, as the general path does."""
    unit = sched.unit
    prefix = sched.prefix_caching
    for req, _, _ in processed:
        computed = req.num_computed + 1
        req.num_computed = computed
        req.in_flight -= 1
        req.forward_tokens += 1
        req.num_output += 1
        req.token_gaps.append(t_end - req.last_token)
        req.last_token = t_end
        req.placeholders -= 1
        if prefix and computed // unit > req.n_cached:
            sched.cache_upto(req, computed)


def steady_decode_steps(sched: Scheduler, processed: Sequence[Entry]) -> int:
    """How many quiet iterations in a row are certain from here, without checking each:
    in the steady state of a quiet run (every running request has one decode token in
    flight, ``processed``, and one placeholder) each iteration moves every request one
    token on, so the first to stop being quiet is known in advance. Returns the fewest
    iterations, over the running requests, before one would complete a chunk to offer or
    deliver its last-but-one token; 0 when the state is not steady. A new block or a filled
    one is work inside the run (:func:`next_block_event`), as long as the free blocks
    cover it. No side effects.

    Invariant (tested against the iteration-by-iteration path): for ``k`` returned,
    :func:`quiet_decode_ready` holds before each of the next ``k`` iterations whose new
    blocks the free ones cover.

    Args:
        sched: the scheduler, :func:`quiet_decode_ready` true for ``processed`` now.
        processed: the entries of the batch in flight.
    """
    running = sched.running
    if len(processed) != len(running) or sched.deferred_frees:
        return 0
    conn = sched.connector
    tpc = conn.tpc if conn is not None else 1 << 62
    prompt_only = conn is None or conn.prompt_only
    steps = 1 << 62
    for (req, _, _), other in zip(processed, running, strict=True):
        # iteration j finds num_computed nc + j and num_output no + j (nc = prompt + no - 1)
        nc, no = req.num_computed, req.num_output
        if req is not other or req.in_flight != 1 or req.placeholders != 1:
            return 0
        if nc != req.prompt + no - 1:
            return 0
        bound = req.output - no - 1  # its last-but-one token is delivered
        first = req.next_store
        if not prompt_only or first < req.n_prompt_chunks:  # the sequence completes a chunk
            chunk = (first + 1) * tpc - req.prompt - no
            bound = chunk if chunk < bound else bound
        steps = bound if bound < steps else steps
    return max(0, steps)


def advance_decoders(sched: Scheduler, starts: Sequence[float], ends: Sequence[float]) -> None:
    """:func:`schedule_quiet` at each of ``starts`` and :func:`update_quiet` at each of
    ``ends`` (the processed batches' forward ends), alternately, done at once: the steps
    that :func:`steady_decode_steps` vouched for (at most that many). Each request's
    counts move by the number of steps and its token gaps are the steps' end times' gaps,
    computed once for all; the scheduler's fences move as each step would move them.

    Args:
        sched: the scheduler in the steady state.
        starts: the schedule times, one per step (at least one); the requests' state does
            not depend on them, a caller that records each step's schedule reads them.
        ends: the end of the batch each step's processing waited for, one per step.
    """
    k = len(ends)
    assert len(starts) == k, (len(starts), k)
    running = sched.running
    if sched.defer_free:  # each step's close and processing move both fences by one
        sched.sched_seq += k - 1
        sched.processed_seq += k
    sched.open_step(len(running) + sched.num_waiting)
    seq = sched.step_seq
    first_end, last_end = ends[0], ends[-1]
    gaps = array("f", [b - a for a, b in zip(ends, islice(ends, 1, None))])
    for req in running:
        req.sched = 1
        req.last_seq = seq
        req.num_computed += k
        req.forward_tokens += k
        req.num_output += k
        token_gaps = req.token_gaps
        token_gaps.append(first_end - req.last_token)
        token_gaps.extend(gaps)
        req.last_token = last_end
    sched.scheduled = list(running)
    sched.close_step(True, [(req, 1, True) for req in running])
