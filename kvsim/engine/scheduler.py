"""One vLLM v1 scheduler step: continuous batching with chunked prefill and preemption.

``schedule(now)`` runs vLLM's ``Scheduler.schedule`` as named steps:

1. ``_schedule_running``: running requests first, in order; each gets its remaining tokens
   through ``clamp_new_tokens`` (one while decoding); ``grow_or_preempt`` gets its blocks,
   preempting the last running request (its blocks freed, its progress dropped: recompute)
   until the current one fits or is itself preempted;
2. ``_schedule_waiting``, only if nobody was preempted: waiting requests in FCFS order while
   the budget and ``max_num_seqs`` allow: a request whose async load finished is promoted; a
   new or preempted one gets its local GPU prefix hit, then the connector lookup
   (``_lookup_hit``, which may defer it: skipped this step, it keeps its place);
   ``_take_admission_blocks`` gets its blocks; an async CPU hit parks the request in
   WAITING_FOR_KV with zero tokens (``_park_for_load``); a request that cannot get its
   blocks stops admission (FCFS);
3. the connector builds its store jobs (``build_connector_meta``).

``update(t_end)`` applies the forward: computed tokens advance, a request whose tokens are
all computed samples one token, and one that reached its output length finishes (blocks
freed tail first, kept cached for prefix hits).

Async scheduling (``EngineParams.async_scheduling``, vLLM's ``AsyncScheduler``): the next
``schedule`` runs before the previous batch is processed, so tokens scheduled but not yet
processed are ``in_flight`` (vLLM counts them computed at once); a request scheduled to
sample gets an output ``placeholder`` so its next decode can be scheduled before the token
exists, and is not scheduled again once its placeholder is its last token; a preempted
request's in-flight output turns ``stale`` (still delivered, it may finish the request,
and the request is not re-admitted before it lands); with a connector, blocks freed while
a step that wrote them is in flight go back to the pool only after that step is processed
(vLLM ``defer_block_free``), and such a request cannot be preempted to make room.

GPU blocks are vLLM's ``--block-size`` (``EngineParams.gpu_block_tokens``, 16) tokens long,
so a partial block wastes at most 15 tokens, as in vLLM. Which blocks are shared follows
the trace: a block inside a complete trace hash unit is shared with every request that has
that unit; the blocks of a prompt's partial unit and of generated tokens are the
request's own (vLLM hashes tokens no other request has), hit again only by the request
itself after a preemption. The GPU block size must divide the trace's unit.

Not modelled from vLLM 0.33's token clamp: the ``max_model_len`` cap (binds only with
speculative decoding; a request past ``max_model_len`` is refused or cut on arrival, as
vLLM's server does: :mod:`kvsim.specs.context`), the adaptive threshold. As in vLLM,
``long_prefill_token_threshold`` applies only while more than one request is running or
waiting (a lone request has nobody to starve).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import cast

from kvsim.core.errors import InputError
from kvsim.engine.connector import OffloadConnector
from kvsim.engine.params import EngineParams
from kvsim.engine.request_state import FINISHED, RUNNING, WAITING, WAITING_FOR_KV, SimRequest
from kvsim.engine.step_batch import StepBatch
from kvsim.manager.gpu_cache import GpuBlockPool


def clamp_new_tokens(n: int, budget: int, threshold: int) -> int:
    """Tokens one request gets this step: vLLM's clamp, shared by the running and waiting loops.

    ``n`` is the tokens the request still has to compute; ``threshold`` is
    ``long_prefill_token_threshold`` (0: off), applied first so a long prefill cannot starve
    the others, then the step's remaining ``budget``. A decode (``n == 1``) is never cut by a
    threshold, which is >= 1 when on.
    """
    if 0 < threshold < n:
        n = threshold
    return n if n <= budget else budget


class _BatchTally:
    """The step's scheduled requests and forward shape, summed as each one is scheduled, and
    what the step hands on: the batch entries for ``update``, the requests that may offer
    stores, and the prefills whose last chunk it scheduled."""

    __slots__ = (
        "context",
        "decode",
        "decode_context",
        "ended_prefills",
        "entries",
        "n_prefill_seqs",
        "offers",
        "pairs",
        "prefill",
        "reqs",
    )

    def __init__(self) -> None:
        self.reqs: list[SimRequest] = []
        self.entries: list[tuple[SimRequest, int, bool]] = []
        self.offers: list[SimRequest] = []
        self.ended_prefills: list[SimRequest] = []
        self.n_prefill_seqs = 0
        self.prefill = 0
        self.decode = 0
        self.context = 0
        self.decode_context = 0
        self.pairs = 0.0

    def add(self, req: SimRequest, n: int, computed: int, is_decode: bool) -> None:
        """Schedule ``n`` tokens of ``req`` after ``computed``: the compute model's inputs."""
        req.sched = n
        self.reqs.append(req)
        if is_decode:
            self.decode += 1
            self.decode_context += computed
        else:
            self.prefill += n
            self.n_prefill_seqs += 1
        self.context += computed
        self.pairs += n * computed + n * (n + 1) / 2

    def batch(self) -> StepBatch:
        return StepBatch(
            len(self.reqs),
            self.n_prefill_seqs,
            self.prefill,
            self.decode,
            self.context,
            self.pairs,
            self.decode_context,
        )


class Scheduler:
    """vLLM v1's scheduler over kvsim's GPU block pool: picks each step's batch, preempts."""

    def __init__(
        self,
        params: EngineParams,
        pool: GpuBlockPool,
        unit_tokens: int,
        connector: OffloadConnector | None,
    ) -> None:
        self.params = params
        self.pool = pool
        block = params.gpu_block_tokens
        if unit_tokens % block:
            raise InputError(
                f"--gpu-block-tokens {block} must divide the trace's {unit_tokens}-token "
                "blocks, so that GPU prefix hits follow what the trace says is shared"
            )
        self.unit = block  # GPU KV blocks are vLLM's --block-size tokens long
        self.blocks_per_unit = unit_tokens // block
        self.connector = connector
        self.prefix_caching = params.enable_prefix_caching
        self.waiting: deque[SimRequest] = deque()
        # vLLM's kv_holding_waiting: waiting requests that hold GPU blocks (an async load in
        # flight or landed) are tried before the plain queue, so they cannot starve behind it
        self.kv_holding: deque[SimRequest] = deque()
        # vLLM's _inflight_prefills: admitted requests whose prompt is not all scheduled
        # yet; an async-load admission must leave their remaining blocks free
        self.inflight_prefills: dict[SimRequest, None] = {}
        self.running: list[SimRequest] = []
        self.scheduled: list[SimRequest] = []
        self.preempted: list[SimRequest] = []
        self.finished: list[SimRequest] = []
        self.num_preemptions = 0
        # the last schedule's batch: (request, tokens, samples a token), for update()
        self.entries: list[tuple[SimRequest, int, bool]] = []
        self.async_mode = params.async_scheduling
        self.finished_unreported = False  # vLLM finished_req_ids: sent with the next schedule
        # vLLM defer_block_free (async + a KV consumer connector): fences of non-empty steps
        self.defer_free = self.async_mode and connector is not None
        self.sched_seq = 0
        self.step_seq = 0  # the fence of the step being scheduled
        self.processed_seq = 0
        self.deferred_frees: deque[tuple[int, list[int]]] = deque()
        # the last schedule's refusal of the plain queue's head for want of free blocks:
        # the request and a lower bound on the blocks it needs (see admits_nothing)
        self.refused: SimRequest | None = None
        self.refused_blocks = 0

    # --- helpers ---

    def _allocate(self, n: int) -> list[int] | None:
        blocks = self.pool.allocate(n)
        if blocks is not None and self.connector is not None:
            self.connector.on_allocate(blocks)
        return blocks

    def _block_keys(self, req: SimRequest, n: int) -> list[Hashable]:
        """Prefix-cache keys of ``req``'s first ``n`` GPU blocks, made as they are needed.

        Block ``i`` inside the trace's complete hash units is shared exactly when its unit
        is (vLLM hashes the same tokens): its key is ``unit key * blocks per unit + position
        in the unit``, one int per (unit, position) pair (ints hash faster than tuples).
        Blocks past them (the prompt's partial unit, generated tokens) hold tokens no other
        request has: their key is the request's own tuple, which only it can hit again
        (after a preemption), as vLLM's hashes of its own tokens.
        """
        keys = req.block_keys
        start = len(keys)
        if start < n:
            per_unit = self.blocks_per_unit
            units = req.unit_keys
            shared = min(n, len(units) * per_unit)
            if start >= shared and n == start + 1:  # a decode block: one more of its own
                keys.append((req.rid, -1 - start))
                return keys
            extend = keys.extend
            while start < shared:  # a unit at a time: block i of unit u is units[u] * per_unit
                u = start // per_unit  # + i - u * per_unit, made by ``range`` in C
                stop = min(shared, (u + 1) * per_unit)
                offset = (units[u] - u) * per_unit
                extend(range(offset + start, offset + stop))
                start = stop
            if start < n:
                rid = req.rid
                keys.extend([(rid, -1 - i) for i in range(start, n)])
        return keys

    def cache_upto(self, req: SimRequest, tokens: int) -> None:
        """Give the full GPU blocks below ``tokens`` their prefix-cache keys."""
        if not self.prefix_caching:
            return
        n = min(tokens, req.prompt + req.num_output) // self.unit  # num_tokens, inlined
        if n > req.n_cached:
            keys = self._block_keys(req, n)
            self.pool.cache_blocks(req.blocks[req.n_cached : n], keys[req.n_cached : n])
            req.n_cached = n

    def _gpu_hit(self, req: SimRequest, most: int) -> int:
        """The GPU prefix hit of ``req``'s first ``most`` blocks. A waiting request is looked
        up at every step until admitted: while no hash has left the pool since its last
        lookup (``GpuBlockPool.lost_seq``), that hit still holds and only the keys past it
        are tried."""
        pool = self.pool
        keys = self._block_keys(req, most)
        memo = req.hit_memo
        known = memo[2] if memo is not None and memo[:2] == (most, pool.lost_seq) else 0
        hit = pool.match_prefix(keys, most, known)
        req.hit_memo = (most, pool.lost_seq, hit)
        return hit

    def _free_hit_blocks(self, req: SimRequest, gpu_hit: int) -> int:
        """How many of ``req``'s first ``gpu_hit`` blocks, cached, sit in the free queue
        (taking them uses free space). A refused request asks again at every step: while
        the pool's ``held_seq`` stands still, its last count holds."""
        pool = self.pool
        memo = req.free_hit_memo
        if memo is not None and memo[:2] == (gpu_hit, pool.held_seq):
            return memo[2]
        n = pool.count_free_cached(req.block_keys[:gpu_hit])
        req.free_hit_memo = (gpu_hit, pool.held_seq, n)
        return n

    def _remaining_blocks(self, req: SimRequest) -> int:
        """Blocks ``req`` still lacks to hold its whole sequence (vLLM
        ``_request_remaining_blocks``)."""
        return max(0, -(-req.num_tokens // self.unit) - len(req.blocks))

    def _release(self, req: SimRequest) -> None:
        """Free ``req``'s blocks, or (vLLM ``_free_request_blocks``) park them until the
        in-flight step that scheduled it is processed."""
        if self.defer_free and req.last_seq > self.processed_seq:
            if req.blocks:
                self.deferred_frees.append((self.sched_seq, req.blocks))
        else:
            self.pool.free(req.blocks)

    def _can_release(self, req: SimRequest) -> bool:
        """vLLM ``_request_blocks_can_be_freed``: preempting it would free blocks now."""
        return not self.defer_free or req.last_seq <= self.processed_seq

    def begin_update(self, computed: bool) -> None:
        """vLLM ``update_from_output`` prologue: a processed non-empty step ends the deferral
        of the blocks freed while it was in flight (returned in the order they were freed)."""
        if not (self.defer_free and computed):
            return
        self.processed_seq += 1
        deferred = self.deferred_frees
        while deferred and deferred[0][0] <= self.processed_seq:
            self.pool.free(deferred.popleft()[1])

    def _preempt(self, req: SimRequest) -> None:
        self.inflight_prefills.pop(req, None)
        self._release(req)
        req.blocks = []
        req.n_cached = 0
        req.num_computed = 0
        req.stale += req.in_flight  # its in-flight output still lands, as stale
        req.in_flight = 0
        req.placeholders = 0
        req.status = WAITING
        req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        self.preempted.append(req)
        if self.connector is not None:
            self.connector.on_preempt(req)

    def _blocks_needed(self, req: SimRequest, n: int) -> int:
        """Blocks ``req`` lacks to hold its computed tokens plus ``n`` more."""
        return -(-(req.num_computed + req.in_flight + n) // self.unit) - len(req.blocks)

    # --- the step ---

    def schedule(self, now: float, step: int) -> StepBatch:
        """vLLM's step order: running requests first; new admissions only if none was preempted."""
        if self.connector is not None:
            self.connector.begin_schedule(step)
        self.refused = None
        self.open_step(len(self.running) + self.num_waiting)
        tally = _BatchTally()
        budget = self._schedule_running(self.params.max_num_batched_tokens, tally)
        if not self.preempted:
            self._schedule_waiting(now, budget, tally)
        self.scheduled = tally.reqs
        if self.connector is not None:
            self.connector.build_store_jobs(tally.offers)
        self._after_schedule(tally)
        return tally.batch()

    def open_step(self, eligible: int) -> None:
        """The start of a ``schedule`` of ``eligible`` running and waiting requests: no
        preemption yet, vLLM's long-prefill threshold (only when more than one competes),
        and the fence the step gets if it schedules anything (see :meth:`close_step`)."""
        self.preempted = []
        self.threshold = self.params.long_prefill_token_threshold if eligible > 1 else 0
        self.step_seq = self.sched_seq + 1 if self.defer_free else self.sched_seq

    def close_step(self, scheduled: bool, entries: list[tuple[SimRequest, int, bool]]) -> None:
        """The end of a ``schedule``: the finishes are reported, the fence advances when
        the step ``scheduled`` anything, and ``entries`` are the step's (request, tokens,
        sampled)."""
        self.finished_unreported = False
        if self.defer_free and scheduled:
            self.sched_seq += 1
        self.entries = entries

    def _after_schedule(self, tally: _BatchTally) -> None:
        """vLLM ``_update_after_schedule``: the scheduled tokens go in flight; a request
        scheduled to its end leaves the in-flight prefills and samples a token (async: it
        gets an output placeholder); the step's fence advances when it computes.

        The per-request part is done as each request is scheduled (``_schedule_running``
        inline, ``_in_flight`` for admissions): nothing between scheduling a request and
        this point reads what it changes, except the in-flight prefills, which the
        admission of an async load sums, so those leave here, and the connector's store
        offers, which count the step's tokens in flight."""
        if tally.ended_prefills:
            pop = self.inflight_prefills.pop
            for req in tally.ended_prefills:
                pop(req, None)
        self.close_step(bool(tally.reqs), tally.entries)

    def _in_flight(self, req: SimRequest, n: int, tally: _BatchTally) -> None:
        """A scheduled request's part of ``_after_schedule``: its tokens go in flight; if they
        reach its end it samples (async: an output placeholder). It may offer stores."""
        req.in_flight += n
        req.last_seq = self.step_seq
        sampled = req.num_computed + req.in_flight >= req.prompt + req.num_output + req.placeholders
        if sampled:
            tally.ended_prefills.append(req)
            if self.async_mode:
                req.placeholders += 1
        tally.entries.append((req, n, sampled))
        tally.offers.append(req)

    def _schedule_running(self, budget: int, tally: _BatchTally) -> int:
        """Give running requests their next chunk or decode token, in order; returns the budget
        left. The first one that cannot get its blocks, even after preemption, ends the loop,
        as in vLLM (the ones behind it are not tried).

        The engine's hottest loop (every running request, every step), so it is written out:
        the clamp, the block and cache checks, ``_BatchTally.add``, ``_in_flight`` and the
        connector's test for a store offer (a chunk may have completed past ``next_store``:
        past the prompt's chunks, prompt-only offers never do). Calls happen only when
        something changes (a new block, a newly full block, a complete chunk)."""
        threshold = self.threshold
        running = self.running
        unit = self.unit
        prefix = self.prefix_caching
        seq = self.step_seq
        placeholders_on = self.async_mode
        conn = self.connector
        # without a connector, chunks so long that no request ever completes one
        tpc = conn.tpc if conn is not None else 1 << 62
        prompt_only = conn is None or conn.prompt_only
        add_req, add_entry, add_offer = tally.reqs.append, tally.entries.append, tally.offers.append
        inflight = self.inflight_prefills
        n_prefill_seqs, prefill, decode = tally.n_prefill_seqs, tally.prefill, tally.decode
        context, decode_context, pairs = tally.context, tally.decode_context, tally.pairs
        for req in running:  # a preemption pops from the tail: the loop then ends sooner
            if budget <= 0:
                break
            in_flight = req.in_flight
            c = req.num_computed + in_flight
            placeholders = req.placeholders
            prompt = req.prompt
            if placeholders and c + 2 - placeholders >= prompt + req.output:
                continue  # async: its last token is already scheduled
            num_tokens = prompt + req.num_output
            left = num_tokens + placeholders - c
            n = threshold if 0 < threshold < left else left  # clamp_new_tokens, inlined
            n = n if n <= budget else budget
            if n <= 0:
                continue
            end = c + n
            if end > len(req.blocks) * unit and not self.grow_or_preempt(req, n):
                break
            if prefix and end // unit > req.n_cached:
                self.cache_upto(req, end)  # decode blocks too, once full (vLLM caches them)
            # _BatchTally.add
            req.sched = n
            add_req(req)
            if n == 1 and c >= prompt:
                decode += 1
                decode_context += c
                pairs += c + 1.0  # n * c + n * (n + 1) / 2 at n = 1
            else:
                prefill += n
                n_prefill_seqs += 1
                pairs += n * c + n * (n + 1) / 2
            context += c
            budget -= n
            # _in_flight
            req.in_flight = in_flight + n
            req.last_seq = seq
            sampled = n == left  # computed + in flight reach the sequence's end
            if sampled and inflight:
                tally.ended_prefills.append(req)
            if sampled and placeholders_on:
                req.placeholders = placeholders + 1
            add_entry((req, n, sampled))
            # prompt-only offers stop at the prompt's chunks (its keys never grow then)
            first = req.next_store
            if (not prompt_only or first < req.n_prompt_chunks) and (
                end if end < num_tokens else num_tokens
            ) // tpc > first:
                add_offer(req)
        tally.n_prefill_seqs, tally.prefill, tally.decode = n_prefill_seqs, prefill, decode
        tally.context, tally.decode_context, tally.pairs = context, decode_context, pairs
        return budget

    def grow_or_preempt(self, req: SimRequest, n: int) -> bool:
        """Get ``req`` the blocks for ``n`` more tokens, preempting from the tail of the running
        list (vLLM FCFS: the latest arrival loses its KV) until they fit. False when ``req``
        itself was preempted: nothing is left to take blocks from."""
        need = -(-(req.num_computed + req.in_flight + n) // self.unit) - len(req.blocks)
        if need <= 0:
            return True
        blocks = self.pool.allocate(need)
        while blocks is None:
            if not self._can_release(self.running[-1]):
                return False  # vLLM: a deferred free would not help now
            victim = self.running.pop()
            self._preempt(victim)
            if victim is req:
                return False
            blocks = self.pool.allocate(need)
        if self.connector is not None:
            self.connector.on_allocate(blocks)
        req.blocks.extend(blocks)
        return True

    def _schedule_waiting(self, now: float, budget: int, tally: _BatchTally) -> None:
        """Admit waiting requests FCFS while budget and ``max_num_seqs`` allow, those holding
        GPU blocks first (vLLM drains ``kv_holding_waiting`` before ``waiting``). A request
        that must wait (load in flight, connector deferral, async load just started) is
        skipped and keeps its place; one that cannot get its blocks stops admission."""
        threshold = self.threshold
        running = self.running
        skipped_holding: list[SimRequest] = []
        skipped_plain: list[SimRequest] = []
        max_seqs = self.params.max_num_seqs
        while budget > 0:
            queue = self.kv_holding if self.kv_holding else self.waiting
            if not queue or len(running) >= max_seqs:
                break
            req = queue[0]
            if not self._ready(req):
                self._skip(queue, skipped_holding, skipped_plain)
                continue
            if req.num_computed == 0:
                hit = self._lookup_hit(req, now)
                if hit is None:
                    self._skip(queue, skipped_holding, skipped_plain)
                    continue
                gpu_hit, ext, is_async = hit
                local = gpu_hit * self.unit
                n = 0 if is_async else self._new_tokens(req, local + ext, budget, threshold)
                if n is None:
                    break
                if not self._take_admission_blocks(req, gpu_hit, ext, is_async, n):
                    break
                if is_async:
                    self._park_for_load(req, now, local, ext)
                    self.inflight_prefills[req] = None
                    self._skip(queue, skipped_holding, skipped_plain)
                    continue
                req.num_computed = local + ext
            else:
                n = self._new_tokens(req, req.num_computed, budget, threshold)
                if n is None or not self._resume_blocks(req, n):
                    break
            queue.popleft()
            self.inflight_prefills[req] = None  # dropped below if this chunk ends the prompt
            self._start_running(req, n, now, tally)
            budget -= n
        if skipped_holding:
            self.kv_holding.extendleft(reversed(skipped_holding))
        if skipped_plain:
            self.waiting.extendleft(reversed(skipped_plain))

    def _new_tokens(
        self, req: SimRequest, computed: int, budget: int, threshold: int
    ) -> int | None:
        """The tokens a waiting request with ``computed`` tokens (hits included) gets this
        step (:func:`clamp_new_tokens`), or None when it must wait: without chunked prefill
        vLLM's waiting loop stops at a request whose new tokens, after the long-prefill
        threshold, exceed what is left of the budget (it keeps its place)."""
        left = req.num_tokens - computed
        if self.params.enable_chunked_prefill:
            return clamp_new_tokens(left, budget, threshold)
        n = clamp_new_tokens(left, left, threshold)  # the threshold alone, no split
        return n if n <= budget else None

    def _ready(self, req: SimRequest) -> bool:
        """Whether a waiting request may be admitted now: an async load in flight blocks it
        (a landed one is promoted, vLLM ``_handle_blocked_waiting_request``), and so does
        stale output of a batch scheduled before its preemption (async scheduling)."""
        if req.status == WAITING_FOR_KV:
            if not req.load_done:
                return False
            self._promote(req)
        return not req.stale

    @staticmethod
    def _skip(queue: deque[SimRequest], holding: list[SimRequest], plain: list[SimRequest]) -> None:
        """vLLM ``skip_request``: set the head aside this step; it goes back to the head of the
        queue that matches what it holds now (an async load just started holds blocks)."""
        req = queue.popleft()
        (holding if req.blocks or req.status == WAITING_FOR_KV else plain).append(req)

    def _resume_blocks(self, req: SimRequest, n: int) -> bool:
        """Blocks for a request that already holds computed tokens (its async load landed):
        its whole sequence must fit (vLLM ``full_sequence_must_fit``), then ``n`` tokens."""
        free = self.pool.num_free
        if self._remaining_blocks(req) > free:
            return False
        need = self._blocks_needed(req, n)
        if need > 0:
            if need > free:
                return False
            req.blocks.extend(cast("list[int]", self._allocate(need)))
        return True

    def _lookup_hit(self, req: SimRequest, now: float) -> tuple[int, int, bool] | None:
        """A new or preempted request's prefix hit: (GPU hit blocks, external tokens, async).

        The GPU hit stops short of the last token, which vLLM always recomputes. None when
        the connector defers the lookup: the request waits, its KV wait clock running until
        a lookup answers (then a request that cannot get its blocks waits in the queue, not
        for KV; an async load starts the clock again until the request runs).
        """
        tokens = req.num_tokens
        gpu_hit = 0
        if self.prefix_caching:
            most = (tokens - 1) // self.unit
            gpu_hit = self._gpu_hit(req, most)
        if self.connector is None:
            return gpu_hit, 0, False
        found = self.connector.lookup(req, gpu_hit * self.unit)
        if found is None:
            req.deferrals += 1
            if req.kv_wait_start is None:
                req.kv_wait_start = now
            return None
        if req.kv_wait_start is not None:  # the deferral ends: any wait after it is the queue's
            req.kv_wait += now - req.kv_wait_start
            req.kv_wait_start = None
        ext, is_async = found
        return gpu_hit, ext, is_async

    def _take_admission_blocks(
        self, req: SimRequest, gpu_hit: int, ext: int, is_async: bool, n: int
    ) -> bool:
        """Give an admitted request its GPU-hit blocks plus fresh ones for the external hit and
        ``n`` new tokens, all or nothing (vLLM ``allocate_slots``): hit blocks sitting in the
        free queue count against free space. On success record its hits and tell the
        connector."""
        unit = self.unit
        pool = self.pool
        local = gpu_hit * unit
        free = pool.num_free
        whole = -(-req.num_tokens // unit) - gpu_hit
        if whole > free:  # fails below whatever the hits hold (a waiting head, every step)
            self.refused, self.refused_blocks = req, whole
            return False
        evictable_hits = self._free_hit_blocks(req, gpu_hit) if gpu_hit else 0
        # vLLM scheduler_reserve_full_isl: the whole prompt must fit before any chunk is taken
        if whole + evictable_hits > free:
            return False
        need = -(-(local + ext + n) // unit) - gpu_hit
        if is_async:  # leave what admitted prefills still need (vLLM reserved_blocks)
            free -= sum(self._remaining_blocks(r) for r in self.inflight_prefills)
        if need + evictable_hits > free:
            return False
        held = pool.acquire_cached(req.block_keys[:gpu_hit]) if gpu_hit else []
        # cannot fail: the check above left ``need`` free blocks after the hits are taken
        fresh = cast("list[int]", self._allocate(need)) if need > 0 else []
        req.blocks = held + fresh
        req.n_cached = gpu_hit
        if not req.admitted:
            req.admitted = True
            req.gpu_hit = local
            req.cpu_hit = ext  # vLLM's num_external_cached_tokens, even when it is the whole prompt
        if self.connector is not None:
            self.connector.on_allocate(req.blocks)
            self.connector.update_state_after_alloc(req, local, ext, is_async)
        return True

    def _park_for_load(self, req: SimRequest, now: float, local: int, ext: int) -> None:
        """An async CPU hit: the request holds its blocks in WAITING_FOR_KV with no tokens
        scheduled until the load lands (vLLM WAITING_FOR_REMOTE_KVS)."""
        req.status = WAITING_FOR_KV
        req.num_computed = local
        req.pending_ext = ext
        req.load_done = False
        if req.kv_wait_start is None:
            req.kv_wait_start = now

    def _start_running(self, req: SimRequest, n: int, now: float, tally: _BatchTally) -> None:
        """Move an admitted request to the running list with ``n`` tokens this step; its
        KV-wait and first-scheduled clocks stop here. Always counted as prefill, as vLLM
        counts a request coming from the waiting queue."""
        req.status = RUNNING
        self.running.append(req)
        c = req.num_computed
        self.cache_upto(req, c + n)
        if req.kv_wait_start is not None:
            req.kv_wait += now - req.kv_wait_start
            req.kv_wait_start = None
        if req.first_scheduled is None:
            req.first_scheduled = now
        tally.add(req, n, c, False)
        self._in_flight(req, n, tally)

    def rescue(self) -> bool:
        """Break a deadlock among requests that hold blocks while waiting (tiny GPU caches).

        Each loaded request can wait for blocks that the others hold, with nothing running
        to free any. The engine calls this only when nothing else can make progress: the
        holders behind the head drop their KV (recompute) and go back to the plain queue.
        """
        victims = list(self.kv_holding)[1:]
        for r in victims:
            self.inflight_prefills.pop(r, None)
            self.pool.free(r.blocks)
            r.blocks = []
            r.n_cached = 0
            r.num_computed = 0
            r.pending_ext = 0
            r.load_done = False
            r.status = WAITING
            r.preemptions += 1
            self.num_preemptions += 1
        if victims:
            self.kv_holding = deque([self.kv_holding[0]])
            self.waiting.extendleft(reversed(victims))
        return bool(victims)

    def admits_nothing(self, free: int) -> bool:
        """Whether ``_schedule_waiting``, run now with ``free`` GPU blocks left after the
        running requests' tokens, would change nothing: no request waits, the running ones
        fill ``max_num_seqs``, or the head of the plain queue (none holds blocks) is the
        request the last ``schedule`` refused for want of blocks and fewer are free now.

        It holds only while every step since that ``schedule`` was a quiet decode step
        (:mod:`kvsim.engine.quiet_decode`) and the connector queues nothing (copies may be
        in flight): then the head's GPU prefix hit cannot have grown (decoders cache blocks
        of their own tokens only), so it needs at least ``refused_blocks``, and retrying its
        lookup changes nothing (a job of its own or a chunk of its being written would have
        deferred it at the refusal, and only a general step makes either; its
        ``next_store`` and the lookup's sync budget come out the same). No side effects.
        """
        if not (self.waiting or self.kv_holding) or len(self.running) >= self.params.max_num_seqs:
            return True
        return (
            not self.kv_holding and self.waiting[0] is self.refused and self.refused_blocks > free
        )

    @property
    def num_waiting(self) -> int:
        """Waiting requests in both queues (vLLM ``get_request_counts``)."""
        return len(self.waiting) + len(self.kv_holding)

    def waiting_requests(self) -> list[SimRequest]:
        """Every waiting request, holders of GPU blocks first (the order they are tried)."""
        return [*self.kv_holding, *self.waiting]

    def _promote(self, req: SimRequest) -> None:
        """vLLM ``_update_waiting_for_remote_kv``: cache the loaded blocks, count them computed."""
        computed = req.num_computed + req.pending_ext
        self.cache_upto(req, computed)
        if computed >= req.num_tokens:
            computed = req.num_tokens - 1  # the last token is always recomputed
        req.num_computed = computed
        req.pending_ext = 0
        req.load_done = False
        req.status = WAITING

    def update(
        self, t_end: float, entries: Sequence[tuple[SimRequest, int, bool]] | None = None
    ) -> list[SimRequest]:
        """Apply a processed batch (default: the last schedule's) whose forward ended at
        ``t_end``; returns the requests that finished.

        vLLM ``update_from_output``: a request's tokens become computed, one scheduled to
        sample gets its token; a stale batch (scheduled before the request was preempted)
        still delivers its token, which may finish the request, but computes nothing."""
        finished = []
        stale_finished = False
        unit = self.unit
        prefix = self.prefix_caching
        for req, n, sampled in self.entries if entries is None else entries:
            status = req.status
            if status == FINISHED:
                continue
            if req.stale > 0:
                if self._deliver_stale(req, n, sampled, t_end):
                    stale_finished = True
                    finished.append(req)
                continue
            num_computed = req.num_computed + n
            req.num_computed = num_computed
            req.in_flight -= n
            req.forward_tokens += n
            if not sampled:
                continue
            num_output = req.num_output + 1
            req.num_output = num_output
            if num_output == 1:  # its first token (output only grows, whichever path)
                req.first_token = t_end
            else:
                req.token_gaps.append(t_end - req.last_token)
            req.last_token = t_end
            if req.placeholders:
                # async: the token replaces its placeholder; vLLM then caches the full blocks
                # the processed batches computed (the in-flight token was not yet in them)
                req.placeholders -= 1
                if prefix and status == RUNNING and num_computed // unit > req.n_cached:
                    self.cache_upto(req, num_computed)
            if num_output >= req.output:
                self._finish(req, t_end)
                finished.append(req)
        if finished:
            self._drop_finished(finished, stale_finished)
        if entries is None:
            self.scheduled = []
        return finished

    def _deliver_stale(self, req: SimRequest, n: int, sampled: bool, t_end: float) -> bool:
        """``update`` of a batch scheduled before ``req`` was preempted: it computes nothing
        (the request recomputes), but its token is delivered and may finish the request
        (then True)."""
        req.stale -= n
        req.forward_tokens += n
        if not sampled:
            return False
        req.num_output += 1
        if req.first_token is None:
            req.first_token = t_end
        else:
            req.token_gaps.append(t_end - req.last_token)
        req.last_token = t_end
        if req.num_output >= req.output:
            self._finish(req, t_end)
            return True
        return False

    def _drop_finished(self, finished: list[SimRequest], from_waiting: bool) -> None:
        """Take finished requests out of their queue (``from_waiting``: some finished by
        stale output while waiting to resume) and tell the connector (vLLM
        ``request_finished``; their final chunks are offered by the next schedule)."""
        self.finished_unreported = True
        self.running = [r for r in self.running if r.status == RUNNING]
        if from_waiting:
            for req in finished:
                if req in self.waiting:
                    self.waiting.remove(req)
        if self.connector is not None:
            self.connector.finished_pending.extend(finished)
            for req in finished:
                self.connector.on_finished(req)

    def _finish(self, req: SimRequest, t_end: float) -> None:
        """The request reached its output length: its blocks are released (kept cached for
        prefix hits; deferred while a step that scheduled it is in flight)."""
        req.status = FINISHED
        req.finish = t_end
        self.inflight_prefills.pop(req, None)
        self._release(req)
        req.block_keys = []  # a finished request is never looked up again; its cached blocks
        # keep their keys in the pool, and the request's row needs none of them
        if self.connector is None:  # else the connector's last offer still reads them
            req.blocks = []
            req.retire()

    @property
    def has_requests(self) -> bool:
        """vLLM ``has_requests``: work to schedule, finishes to report, or connector jobs."""
        return bool(
            self.running
            or self.waiting
            or self.kv_holding
            or self.finished_unreported
            or (self.connector is not None and self.connector.jobs)
        )
