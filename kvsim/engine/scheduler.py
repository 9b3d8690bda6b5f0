"""One vLLM v1 scheduler step: continuous batching with chunked prefill and preemption.

``schedule(now)``:

1. running requests first, in order: each gets ``min(remaining, budget)`` tokens (one while
   decoding); when GPU blocks run out the last running request is preempted (its blocks
   freed, its progress dropped: recompute) until the current one fits or is itself preempted;
2. only if nobody was preempted, waiting requests in FCFS order while the budget and
   ``max_num_seqs`` allow: a request whose async load finished is promoted; a new or
   preempted one gets its local GPU prefix hit, then the connector lookup (which may defer
   it: skipped this step, it keeps its place); an async CPU hit allocates blocks and parks
   the request in WAITING_FOR_KV with zero tokens; a request that cannot get its blocks
   stops admission (FCFS);
3. the connector builds its store jobs (``build_connector_meta``).

``update(t_end)`` applies the forward: computed tokens advance, a request whose tokens are
all computed samples one token, and one that reached its output length finishes (blocks
freed tail first, kept cached for prefix hits).

GPU blocks are ``KeyLayout.unit_tokens`` long (the trace's hash block, 512 tokens for
Mooncake), not vLLM's 16: a request's partial last block holds a whole block, and prefix
hits are in whole hash blocks (the trace cannot say more). Decode blocks get no prefix
hash (the trace has no hashes for output tokens).
"""

from __future__ import annotations

from collections import deque

from kvsim.engine.compute_model import StepBatch
from kvsim.engine.connector import OffloadConnector
from kvsim.engine.params import EngineParams
from kvsim.engine.request_state import FINISHED, RUNNING, WAITING, WAITING_FOR_KV, SimRequest
from kvsim.gpu_cache import GpuBlockPool


class Scheduler:
    def __init__(self, params: EngineParams, pool: GpuBlockPool, unit_tokens: int,
                 connector: OffloadConnector | None) -> None:
        self.params = params
        self.pool = pool
        self.unit = unit_tokens
        self.connector = connector
        self.prefix_caching = params.enable_prefix_caching
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.scheduled: list[SimRequest] = []
        self.preempted: list[SimRequest] = []
        self.finished: list[SimRequest] = []
        self.num_preemptions = 0

    # --- helpers ---

    def _allocate(self, n: int) -> list[int] | None:
        blocks = self.pool.allocate(n)
        if blocks is not None and self.connector is not None:
            self.connector.on_allocate(blocks)
        return blocks

    def _cache_upto(self, req: SimRequest, tokens: int) -> None:
        if not self.prefix_caching:
            return
        n = min(len(req.unit_keys), tokens // self.unit)
        if n > req.n_cached:
            self.pool.cache_blocks(req.blocks[req.n_cached : n], req.unit_keys[req.n_cached : n])
            req.n_cached = n

    def _free_hit_blocks(self, keys: list) -> int:
        """How many of these cached blocks sit in the free queue (taking them uses free space)."""
        return self.pool.count_free_cached(keys)

    def _preempt(self, req: SimRequest) -> None:
        self.pool.free(req.blocks)
        req.blocks = []
        req.n_cached = 0
        req.num_computed = 0
        req.status = WAITING
        req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        self.preempted.append(req)
        if self.connector is not None:
            self.connector.on_preempt(req)

    # --- the step ---

    def schedule(self, now: float, step: int) -> StepBatch:
        conn = self.connector
        if conn is not None:
            conn.begin_schedule(step)
        params = self.params
        unit = self.unit
        budget = params.max_num_batched_tokens
        threshold = params.long_prefill_token_threshold
        running = self.running
        scheduled: list[SimRequest] = []
        self.preempted = []
        n_prefill_seqs = prefill = decode = context = 0
        pairs = 0.0

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = req.prompt + req.num_output - req.num_computed
            if n > 1 and threshold and n > threshold:
                n = threshold
            if n > budget:
                n = budget
            need = -(-(req.num_computed + n) // unit) - len(req.blocks)
            if need > 0:
                blocks = self._allocate(need)
                while blocks is None:
                    victim = running.pop()
                    self._preempt(victim)
                    if victim is req:
                        break
                    blocks = self._allocate(need)
                if blocks is None:
                    break
                req.blocks.extend(blocks)
            c = req.num_computed
            if c < req.prompt:
                self._cache_upto(req, c + n)
            req.sched = n
            scheduled.append(req)
            budget -= n
            if n == 1 and c >= req.prompt:
                decode += 1
            else:
                prefill += n
                n_prefill_seqs += 1
            context += c
            pairs += n * c + n * (n + 1) / 2
            i += 1

        if not self.preempted:
            waiting = self.waiting
            skipped: list[SimRequest] = []
            max_seqs = params.max_num_seqs
            pool = self.pool
            while waiting and budget > 0 and len(running) < max_seqs:
                req = waiting[0]
                if req.status == WAITING_FOR_KV:
                    if not req.load_done:
                        waiting.popleft()
                        skipped.append(req)
                        continue
                    self._promote(req)
                if req.num_computed == 0:
                    tokens = req.num_tokens
                    gpu_hit = 0
                    if self.prefix_caching and req.unit_keys:
                        gpu_hit = pool.match_prefix(req.unit_keys, (tokens - 1) // unit)
                    local = gpu_hit * unit
                    ext, is_async = 0, False
                    if conn is not None:
                        found = conn.lookup(req, local)
                        if found is None:
                            req.deferrals += 1
                            if req.kv_wait_start is None:
                                req.kv_wait_start = now
                            waiting.popleft()
                            skipped.append(req)
                            continue
                        ext, is_async = found
                    if is_async:
                        n = 0
                    else:
                        n = tokens - local - ext
                        if threshold and n > threshold:
                            n = threshold
                        if n > budget:
                            n = budget
                    hit_keys = req.unit_keys[:gpu_hit]
                    need = -(-(local + ext + n) // unit) - gpu_hit
                    if need + (self._free_hit_blocks(hit_keys) if gpu_hit else 0) > pool.num_free:
                        break
                    held = pool.acquire_cached(hit_keys) if gpu_hit else []
                    fresh = self._allocate(need) if need > 0 else []
                    req.blocks = held + fresh
                    req.n_cached = gpu_hit
                    if not req.admitted:
                        req.admitted = True
                        req.gpu_hit = local
                        req.cpu_hit = ext if local + ext < tokens else ext - 1
                    if conn is not None:
                        conn.update_state_after_alloc(req, local, ext, is_async)
                    if is_async:
                        req.status = WAITING_FOR_KV
                        req.num_computed = local
                        req.pending_ext = ext
                        req.load_done = False
                        if req.kv_wait_start is None:
                            req.kv_wait_start = now
                        waiting.popleft()
                        skipped.append(req)
                        continue
                    req.num_computed = local + ext
                else:
                    n = req.num_tokens - req.num_computed
                    if threshold and n > threshold:
                        n = threshold
                    if n > budget:
                        n = budget
                    need = -(-(req.num_computed + n) // unit) - len(req.blocks)
                    if need > 0:
                        blocks = self._allocate(need)
                        if blocks is None:
                            break
                        req.blocks.extend(blocks)
                waiting.popleft()
                req.status = RUNNING
                running.append(req)
                c = req.num_computed
                self._cache_upto(req, c + n)
                if req.kv_wait_start is not None:
                    req.kv_wait += now - req.kv_wait_start
                    req.kv_wait_start = None
                if req.first_scheduled is None:
                    req.first_scheduled = now
                req.sched = n
                scheduled.append(req)
                budget -= n
                prefill += n
                n_prefill_seqs += 1
                context += c
                pairs += n * c + n * (n + 1) / 2
            if skipped:
                waiting.extendleft(reversed(skipped))

        self.scheduled = scheduled
        if conn is not None:
            conn.build_store_jobs(scheduled)
        return StepBatch(len(scheduled), n_prefill_seqs, prefill, decode, context, pairs)

    def rescue(self) -> bool:
        """Break an ordering deadlock vLLM itself can fall into with a tiny GPU cache.

        vLLM promotes a loaded request only at the head of the queue and keeps a promoted
        request that could not get its blocks in the queue with them; a preempted request
        put ahead of it that needs those blocks then waits forever. The engine calls this
        only when nothing else can make progress: first the block holders move to the
        head; if the head is still stuck, the other holders drop their KV (recompute).
        """
        waiting = self.waiting
        holders = [r for r in waiting if r.blocks]
        if not waiting:
            return False
        if holders and waiting[0] is not holders[0] and not waiting[0].blocks:
            self.waiting = deque(holders + [r for r in waiting if not r.blocks])
            return True
        victims = [r for r in list(waiting)[1:] if r.blocks]
        for r in victims:
            self.pool.free(r.blocks)
            r.blocks = []
            r.n_cached = 0
            r.num_computed = 0
            r.pending_ext = 0
            r.load_done = False
            r.status = WAITING
            r.preemptions += 1
            self.num_preemptions += 1
        return bool(victims)

    def _promote(self, req: SimRequest) -> None:
        """vLLM ``_update_waiting_for_remote_kv``: cache the loaded blocks, count them computed."""
        computed = req.num_computed + req.pending_ext
        self._cache_upto(req, computed)
        if computed >= req.num_tokens:
            computed = req.num_tokens - 1  # the last token is always recomputed
        req.num_computed = computed
        req.pending_ext = 0
        req.load_done = False
        req.status = WAITING

    def update(self, t_end: float) -> list[SimRequest]:
        """Apply the forward pass; returns the requests that finished."""
        finished = []
        for req in self.scheduled:
            n = req.sched
            req.sched = 0
            req.num_computed += n
            req.forward_tokens += n
            if req.num_computed >= req.prompt + req.num_output:
                req.num_output += 1
                if req.first_token is None:
                    req.first_token = t_end
                if req.num_output >= req.output:
                    req.status = FINISHED
                    req.finish = t_end
                    self.pool.free(req.blocks)
                    finished.append(req)
        if finished:
            self.running = [r for r in self.running if r.status == RUNNING]
            if self.connector is not None:
                self.connector.finished_pending.extend(finished)
        self.scheduled = []
        return finished
