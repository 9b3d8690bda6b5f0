"""The OffloadingConnector's timing, as vLLM 0.33 does it (docs/vllm-offload-semantics.md §5).

Scheduler side (called by :mod:`kvsim.engine.scheduler` during ``schedule()``):

* ``lookup``: after the local GPU hit, scan the CPU tier from ``floor(local / chunk)`` to
  the first MISS; defer (None) when the request has jobs in flight, a scanned key's
  write is pending, or a hit key is being async-loaded by another request;
* ``update_state_after_alloc``: pin the hit chunks (``prepare_load``) and create the load
  job; ``next_store`` jumps past the loaded chunks;
* ``build_store_jobs`` (vLLM ``build_connector_meta``): offer each scheduled request's
  newly complete chunks (prompt only by default), retry after a failed offer, then for the
  requests that finished in the previous step offer their final chunks and call
  ``on_request_finished``; finally ``on_schedule_end``.

Worker side (called by the engine around the forward pass):

* ``begin_execute``: flush fence (wait for store jobs whose GPU blocks are being reused
  or whose request was preempted), submit the previous step's stores, submit sync loads
  on the expedited queue and wait for them; the forward is launched only once the worker
  thread has done the host part of its submissions (vLLM's ``handle_preemptions`` builds
  each store's descriptors and calls ``cuMemcpyBatchAsync`` on that thread before the
  forward: about 0.5 us per descriptor, the link's ``per_copy_s``);
* ``after_launch``: once the forward is launched, submit async loads (their stream waits
  for the compute stream: they start when the forward ends), then poll completions
  (vLLM ``get_finished`` runs after the launch, so a job that ends during the forward is
  seen one step later);
* ``end_execute``: queue this step's stores for the next step; ``complete_store`` /
  ``complete_load`` for what ``after_launch`` saw finished. Under async scheduling the two
  halves run apart: ``queue_stores`` right after the launch (vLLM ``wait_for_save``), and
  ``complete`` with the batch's ``take_results`` when the batch is processed, one step later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.core.keys import ChunkKey, KeyLayout, request_private_key
from kvsim.engine.request_state import FINISHED, SimRequest
from kvsim.engine.transfer_protocol import EXPEDITED, LOAD, STORE, TransferJob, TransferResult
from kvsim.manager.offload import OffloadManager

if TYPE_CHECKING:
    from kvsim.engine.clock import Clock
    from kvsim.engine.transfer_protocol import TransferBackend


@dataclass(slots=True, eq=False)
class ConnectorJob:
    """One load or store of one request, from submission to completion."""

    job_id: int
    direction: str
    req: SimRequest
    keys: Sequence[ChunkKey]  # offload keys (chunk keys)
    blocks: list[int]  # GPU block ids
    chunk_ids: list[int]  # CPU chunk ids
    nbytes: int
    copies: int
    step: int

    def transfer_job(self, now: float) -> TransferJob:
        return TransferJob(
            self.job_id,
            self.direction,
            self.blocks,
            self.chunk_ids,
            self.nbytes,
            self.copies,
            self.keys,
            now,
        )


class OffloadConnector:
    """vLLM's OffloadingConnector on both sides: it turns scheduling into load and store jobs."""

    def __init__(
        self,
        manager: OffloadManager,
        layout: KeyLayout,
        *,
        kv_bytes_per_token: int,
        num_layers: int,
        gpu_block_tokens: int = 16,
        prompt_only: bool = True,
        sync_load_budget_bytes: int = 0,
    ) -> None:
        self.manager = manager
        # a manager with secondary tiers scans per request (its lookups promote and may
        # answer RETRY); the CPU tier alone scans without one
        self._scan = getattr(manager, "scan_prefix", None)
        self.tpc = layout.chunk_tokens
        self.unit = gpu_block_tokens  # GPU KV block (vLLM --block-size)
        if self.tpc % gpu_block_tokens:
            raise ValueError(
                f"{self.tpc}-token CPU chunks are not whole {gpu_block_tokens}-token GPU blocks"
            )
        self.upc = self.tpc // gpu_block_tokens  # GPU blocks per CPU chunk
        self.kv_bytes_per_token = kv_bytes_per_token  # one worker's bytes (what one link moves)
        self.copies_per_token = (
            num_layers / gpu_block_tokens
        )  # vLLM: one copy per (GPU block, layer)
        self.prompt_only = prompt_only
        self.sync_budget = sync_load_budget_bytes
        self._sync_left = sync_load_budget_bytes
        self.jobs: dict[int, ConnectorJob] = {}
        self.being_loaded: dict[ChunkKey, int] = {}  # key -> async loads in flight
        # GPU block -> the store job reading it, or a set of them when more than one (most
        # blocks have one: an int is cheaper to make, and is no work for the collector)
        self.fence: dict[int, int | set[int]] = {}
        self.flush: set[int] = set()
        # GPU blocks handed out this step, as handed out (a set is made only when a finished
        # request's store needs the check: every step allocates, few need it)
        self._allocated: list[tuple[int, ...]] = []
        self.finished_pending: list[SimRequest] = []
        # finished requests that made their last offer, stores still in flight (retired as
        # their last job ends)
        self._draining: set[SimRequest] = set()
        self.store_next: list[ConnectorJob] = []  # built this step, submitted next step
        self.store_now: list[ConnectorJob] = []  # built last step, submitted this step
        self.sync_loads: list[ConnectorJob] = []
        self.async_loads: list[ConnectorJob] = []
        self._held_results: list[TransferResult] = []
        self._next_job = 0
        self.step = 0
        # cumulative counters (vLLM connector metrics)
        self.allocation_failures = 0
        self.load_bytes = self.store_bytes = 0
        self.stall_time = 0.0
        self.submit_host_time = 0.0  # of stall_time: the forward waiting for submissions
        self.stores_submitted = self.loads_submitted = 0

    # --- scheduler side ---

    def begin_schedule(self, step: int) -> None:
        self.step = step
        self._sync_left = self.sync_budget
        self._allocated.clear()

    def on_allocate(self, blocks: Iterable[int]) -> None:
        """GPU blocks handed out this step: fresh ones (vLLM's new block ids of every scheduled
        request) and the prefix-hit blocks of admitted requests (``update_state_after_alloc``
        sees all their blocks). One that a pending store of a finished request still reads
        forces a flush."""
        blocks = tuple(blocks)
        self._allocated.append(blocks)
        fence = self.fence
        # hot (every allocation): the fence is usually empty or elsewhere, checked in C
        if fence and not fence.keys().isdisjoint(blocks):
            flush = self.flush
            for b in blocks:
                jobs = fence.get(b)
                if jobs is None:
                    continue
                if isinstance(jobs, int):
                    flush.add(jobs)
                else:
                    flush.update(jobs)

    def on_preempt(self, req: SimRequest) -> None:
        for j in req.jobs:
            if self.jobs[j].direction == STORE:
                self.flush.add(j)

    def lookup(self, req: SimRequest, local: int) -> tuple[int, bool] | None:
        """``(external hit tokens, async)``, or None to defer the request this step."""
        if req.jobs:
            return None
        req.next_store = 0
        tpc = self.tpc
        keys = req.chunk_keys
        max_hit = min(req.num_tokens, len(keys) * tpc)
        if max_hit - local < tpc:
            return 0, False
        start = local // tpc
        window = keys[start : -(-max_hit // tpc)]
        scan = self._scan
        count, pending = (
            self.manager.lookup_prefix(window) if scan is None else scan(window, req.ctx)
        )
        if pending:
            return None
        hit = tpc * (start + count) - local
        if hit < tpc:
            return 0, False
        if self.being_loaded:
            loading = self.being_loaded
            for k in window[:count]:
                if k in loading:
                    return None
        if self.sync_budget and local + hit < req.num_tokens:
            cost = hit * self.kv_bytes_per_token
            if cost <= self._sync_left:
                self._sync_left -= cost
                return hit, False
        return hit, True

    def update_state_after_alloc(
        self, req: SimRequest, local: int, ext: int, is_async: bool
    ) -> None:
        if ext == 0:
            return
        tpc, unit = self.tpc, self.unit
        start = local // tpc
        n_chunks = -(-(local + ext) // tpc)
        keys = req.chunk_keys[start:n_chunks]
        req.next_store = n_chunks
        chunk_ids = self.manager.prepare_load(keys, req.ctx)
        blocks = req.blocks[local // unit : -(-(local + ext) // unit)]
        job = self._new_job(EXPEDITED if not is_async else LOAD, req, keys, blocks, chunk_ids, ext)
        if is_async:
            loading = self.being_loaded
            for k in keys:
                loading[k] = loading.get(k, 0) + 1
            self.async_loads.append(job)
        else:
            self.sync_loads.append(job)

    def build_store_jobs(self, scheduled: list[SimRequest]) -> None:
        """Offer the newly complete chunks of the step's scheduled requests (their tokens are
        in flight already: the scheduler passes those that may have completed a chunk), then
        the final chunks of the requests that finished in the previous step."""
        for req in scheduled:
            self._offer(req, req.num_computed + req.in_flight)
        finished, self.finished_pending = self.finished_pending, []
        for req in finished:
            self._offer(req, max(req.prompt, req.num_tokens - 1))
            self.manager.on_request_finished(req.ctx)
            req.blocks = []  # its last offer was made: the pool holds its blocks now
            if req.jobs:
                self._draining.add(req)
            else:
                req.retire()
        self.manager.on_schedule_end()

    def _offer(self, req: SimRequest, tokens_after: int) -> None:
        tpc = self.tpc
        offloadable = min(tokens_after, req.num_tokens)
        if self.prompt_only:
            offloadable = min(offloadable, req.prompt)
        n = min(offloadable // tpc, len(req.blocks) // self.upc)
        if not self.prompt_only and n > len(req.chunk_keys):
            self._extend_keys(req, n)
        n = min(n, len(req.chunk_keys))
        first = req.next_store
        if n <= first:
            return
        offer = req.chunk_keys[first:n]
        out = self.manager.prepare_store(offer, req.ctx)
        if out is None:
            self.allocation_failures += 1
            return
        req.next_store = n
        stored = out.keys_to_store
        if not stored:
            return
        upc = self.upc
        blocks: list[int] = []
        if len(stored) == len(offer):
            blocks = req.blocks[first * upc : n * upc]
        else:
            positions = req.ctx.positions
            for k in stored:
                c = positions[k] // tpc - 1
                blocks.extend(req.blocks[c * upc : (c + 1) * upc])
        job = self._new_job(STORE, req, stored, blocks, out.chunk_ids, len(stored) * tpc)
        self.store_next.append(job)
        if req.status == FINISHED:  # its blocks are free: fence them from now on
            self._fence(job)
            if self._allocated_now_any(blocks):
                self.flush.add(job.job_id)

    @property
    def allocated_now(self) -> set[int]:
        """GPU blocks handed out this step."""
        return set().union(*self._allocated)

    def _allocated_now_any(self, blocks: list[int]) -> bool:
        """Whether one of ``blocks`` was handed out this step."""
        mine = set(blocks)
        return any(not mine.isdisjoint(handed) for handed in self._allocated)

    def _fence(self, job: ConnectorJob) -> None:
        """Reusing one of ``job``'s GPU blocks before it is stored must flush it first."""
        fence, job_id = self.fence, job.job_id
        for b in job.blocks:
            s = fence.get(b)
            if s is None:
                fence[b] = job_id
            elif isinstance(s, int):
                fence[b] = {s, job_id}
            else:
                s.add(job_id)

    def _unfence(self, job: ConnectorJob) -> None:
        """``job`` is stored: its GPU blocks no longer wait for it."""
        fence, job_id = self.fence, job.job_id
        for b in job.blocks:
            s = fence.get(b)
            if s is None:
                continue
            if isinstance(s, int):
                if s == job_id:
                    del fence[b]
            else:
                s.discard(job_id)
                if not s:
                    del fence[b]

    def on_finished(self, req: SimRequest) -> None:
        """vLLM ``request_finished``: the request's blocks go back to the pool, so the store
        jobs still reading them are fenced (a running request's blocks are protected by their
        reference count, a preempted one's stores are flushed)."""
        jobs = self.jobs
        for j in req.jobs:
            job = jobs[j]
            if job.direction == STORE:
                self._fence(job)

    def _extend_keys(self, req: SimRequest, n: int) -> None:
        """Decode chunks have no trace hash: give them keys no other request can hit."""
        keys = req.chunk_keys
        if req.n_prompt_chunks < req.prompt // self.tpc:
            return  # the trace lacks hashes for part of the prompt: no contiguous keys
        positions = req.ctx.positions
        for c in range(len(keys), n):
            key = request_private_key(req.rid, c)
            keys.append(key)
            positions[key] = (c + 1) * self.tpc

    def _new_job(
        self,
        direction: str,
        req: SimRequest,
        keys: Sequence[ChunkKey],
        blocks: list[int],
        chunk_ids: Sequence[int],
        tokens: int,
    ) -> ConnectorJob:
        self._next_job += 1
        copies = max(1, round(tokens * self.copies_per_token))
        job = ConnectorJob(
            self._next_job,
            direction,
            req,
            keys,
            blocks,
            list(chunk_ids),
            tokens * self.kv_bytes_per_token,
            copies,
            self.step,
        )
        self.jobs[job.job_id] = job
        req.jobs.add(job.job_id)
        return job

    # --- worker side ---

    def begin_execute(
        self,
        backend: TransferBackend,
        clock: Clock,
        on_submit: Callable[[ConnectorJob, float], None],
        compute_tail: float = 0.0,
    ) -> float:
        """Flush, submit stores and loads; returns the stall before the forward in seconds:
        the submissions' host time, the flush and the sync loads.

        Stores wait for the compute stream: they start no earlier than ``compute_tail``, the
        end of the last forward launched (async scheduling launches before it ends)."""
        t0 = clock.now()
        ready = max(t0, compute_tail)
        flush, self.flush = self.flush, set()
        submit_now = self.store_now
        self.store_now = []
        if flush:
            early = [j for j in self.store_next if j.job_id in flush]
            if early:
                self.store_next = [j for j in self.store_next if j.job_id not in flush]
                submit_now = submit_now + early
        self.stores_submitted = len(submit_now)
        self.loads_submitted = len(self.sync_loads) + len(self.async_loads)
        for job in submit_now:
            on_submit(job, t0)
            backend.submit(job.transfer_job(ready), t0)
        # the forward's launch waits for the worker thread (submit_store is synchronous)
        submitted = backend.host_free_time()
        self.submit_host_time += max(0.0, submitted - t0)
        clock.wait_until(submitted)
        if flush:
            live = [j for j in flush if j in self.jobs]
            if live:
                t, results = backend.wait(live, clock.now())
                clock.wait_until(t)
                self._held_results.extend(results)
        if self.sync_loads:
            now = clock.now()
            ids: list[int] = []
            for job in self.sync_loads:
                on_submit(job, now)
                backend.submit(job.transfer_job(now), now)
                ids.append(job.job_id)
            self.sync_loads = []
            t, results = backend.wait(ids, now)
            clock.wait_until(t)
            self._held_results.extend(results)
        stall = clock.now() - t0
        self.stall_time += stall
        return stall

    def after_launch(
        self,
        backend: TransferBackend,
        launch: float,
        forward_end: float,
        on_submit: Callable[[ConnectorJob, float], None],
    ) -> None:
        """What vLLM's worker does once the forward is launched at ``launch``: start the async
        loads, whose copy stream waits for the compute stream (so they run from
        ``forward_end``), then poll finished jobs (``get_finished``): what finished by the
        launch is processed at this step's end, the rest at a later step's."""
        for job in self.async_loads:
            on_submit(job, launch)
            backend.submit(job.transfer_job(forward_end), launch)
        self.async_loads = []
        self._held_results.extend(backend.poll(launch))

    def end_execute(
        self,
        backend: TransferBackend,
        now: float,
        on_done: Callable[[ConnectorJob, TransferResult], None],
    ) -> int:
        """Queue this step's stores; process the transfers ``after_launch`` saw finished.
        Returns jobs completed."""
        self.queue_stores()
        return self.complete(self.take_results(), on_done)

    def queue_stores(self) -> None:
        """vLLM ``wait_for_save``: this step's stores are submitted by the next step."""
        self.store_now, self.store_next = self.store_next, []

    def take_results(self) -> list[TransferResult]:
        """The completions this step's worker calls saw (flush waits and the poll)."""
        results, self._held_results = self._held_results, []
        return results

    def complete(
        self,
        results: list[TransferResult],
        on_done: Callable[[ConnectorJob, TransferResult], None],
    ) -> int:
        """vLLM ``update_connector_output``: finished stores become hits, finished loads
        release their requests; returns the jobs completed."""
        n = 0
        manager = self.manager
        for r in results:
            job = self.jobs.pop(r.job_id, None)
            if job is None:
                continue
            n += 1
            req = job.req
            req.jobs.discard(job.job_id)
            if job.direction == STORE:
                manager.complete_store(job.keys, req.ctx, success=r.success)
                self.store_bytes += r.nbytes
                fence = self.fence
                # most stores were never fenced (their request was running): checked in C
                if fence and not fence.keys().isdisjoint(job.blocks):
                    self._unfence(job)
            else:
                manager.complete_load(job.keys, req.ctx)
                self.load_bytes += r.nbytes
                if job.direction == LOAD:
                    loading = self.being_loaded
                    for k in job.keys:
                        c = loading[k] - 1
                        if c:
                            loading[k] = c
                        else:
                            del loading[k]
                    req.load_done = True
            on_done(job, r)
            if not req.jobs and req in self._draining:
                self._draining.remove(req)
                req.retire()
        return n

    def worker_quiet(self) -> bool:
        """Nothing queued or held and no GPU block fenced: a step that offers nothing makes
        no worker call but the poll of the jobs in flight, if any (the quiet decode steps'
        condition, :mod:`.quiet_decode`; a fenced block could be handed to a decoder)."""
        return not (self._held_results or self.has_queued_work or self.fence)

    def idle_step(self, step: int) -> None:
        """Every connector call of a step while :meth:`worker_quiet`, with nothing scheduled
        to offer, but the poll (the caller's): ``begin_schedule``, ``build_store_jobs``,
        and what ``begin_execute``, ``after_launch`` and ``end_execute`` change when they
        find nothing to submit, wait for or complete."""
        self.begin_schedule(step)
        self.manager.on_schedule_end()
        self.stores_submitted = self.loads_submitted = 0

    @property
    def has_queued_work(self) -> bool:
        return bool(
            self.finished_pending
            or self.store_now
            or self.store_next
            or self.sync_loads
            or self.async_loads
            or self.flush
        )
