"""Reference runs of kvsim requests through vLLM 0.33.0's own engine-side code, on CPU.

:func:`run_vllm_engine` drives vLLM's ``Scheduler`` (``AsyncScheduler`` when
``async_scheduling=True``) with its ``KVCacheManager``, and, when ``cpu_chunks`` is given,
the ``OffloadingConnector`` with the ``CPUOffloadingSpec`` (its real
``OffloadingConnectorScheduler`` + ``CPUOffloadingManager`` + lru/arc policy on the scheduler
side, its real ``OffloadingConnectorWorker`` on the worker side). Only three things are
simulated: the forward pass (a duration), the copy engine (an ``OffloadingWorker`` that
completes jobs on a simulated clock) and the clock itself. Everything that decides what
runs when (admission, prefix hits, preemption, lookups, loads, store offers, flush fences,
eviction) is vLLM's code.

Objects built by hand (no GPU, no model, no profiling)
-------------------------------------------------------
* A ``config.json`` in a temporary folder naming ``KvsimDummyForCausalLM``, a trivial
  ``nn.Module`` registered with ``ModelRegistry`` (never instantiated); ``ModelConfig`` with
  ``skip_tokenizer_init``; ``DeviceConfig(device="cpu")``.
* ``SchedulerConfig(max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold,
  enable_chunked_prefill (default True), async_scheduling)`` and ``CacheConfig(block_size=
  gpu_block_tokens, enable_prefix_caching=True)``; every other setting is vLLM 0.33's default
  (notably ``scheduler_reserve_full_isl=True``, ``watermark=0``, ``sync_load_budget_bytes=0``,
  ``offload_prompt_only=True``, hash ``sha256``).
* ``KVCacheConfig`` with ``num_blocks = gpu_blocks``, as ``num_gpu_blocks_override`` gives it:
  vLLM's ``BlockPool`` takes block 0 out as the null block, so ``gpu_blocks - 1`` are usable
  (kvsim's ``EngineParams.gpu_blocks`` means the same), and one full-attention group whose
  page is ``gpu_block_tokens * kv_bytes_per_token`` bytes.
* ``max_model_len`` (when not given) is ``(gpu_blocks - 1) * gpu_block_tokens``: what vLLM's
  ``max_model_len=-1`` auto-fit derives from the usable blocks.
* Offloading: ``KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both")`` with
  ``block_size=chunk_tokens``, ``eviction_policy=policy``, ``store_threshold`` and a
  ``cpu_bytes_to_use`` of exactly ``cpu_chunks`` page-aligned chunk rows (asserted against the
  manager's chunk count). The worker-side connector is built by vLLM's factory in the WORKER
  role; ``register_kv_caches`` (CUDA tensors) is skipped and its ``worker`` is a
  :class:`SimTransferWorker`.
* Prompts: every trace block (``block_tokens`` tokens) is a deterministic draw from its hash
  id; blocks without an id and the partial tail are drawn from the request id, so they are
  never shared. vLLM hashes them itself (``init_none_hash`` + ``get_request_block_hasher`` at
  ``gpu_block_tokens``), so vLLM shares exactly what the trace shares. Sampling parameters:
  ``max_tokens = max(1, output_tokens)``, ``ignore_eos=True``; every sampled token is id 1.
* Rejection: a request with ``input_tokens + max(1, output_tokens) > max_model_len`` (or an
  empty prompt) is not submitted (``RequestRecord.rejected``). vLLM's input processor itself
  only rejects ``prompt >= max_model_len``, and its OpenAI server clamps ``max_tokens`` to
  ``max_model_len - prompt`` rather than rejecting; the rule here is "can never fit".

Loop (EngineCore + GPUModelRunner call order)
---------------------------------------------
Arrivals are counted from the first one (:func:`rebased`), as kvsim's timed mode counts
them. One iteration, at host time ``now``:

1. Requests with ``arrival_s <= now`` are added (``Scheduler.add_request``), in
   ``(arrival_s, request_id)`` order. If the engine has no work (``has_requests()`` false and
   no batch in flight) the clock jumps to the next arrival.
2. ``scheduler.schedule()``.
3. Worker ``execute_model`` (all at host time ``now``; host work takes no time):
   a. ``handle_preemptions(meta)``: submits the store jobs queued by the previous
      ``wait_for_save`` (plus the flushed ones of this metadata) and **waits** for
      ``jobs_to_flush``: the host clock advances to the last of their completion times
      (``StepRecord.stall_s``).
   b. If ``has_sync_kv_loads``: ``start_load_kv`` (expedited loads, waited for) before the
      forward. (Never happens here: ``sync_load_budget_bytes`` is 0.)
   c. Forward launch, when the step scheduled tokens: it runs on the GPU from
      ``start_s = max(now, end of the previous forward)`` (``now`` after any stall) to
      ``end_s = start_s + (step_s + per_token_s * total_num_scheduled_tokens)`` (the duration
      summed first, as kvsim's engine does, so float ties fall the same way). A step that
      scheduled nothing has no forward and ``start_s = end_s = now``; it still runs the
      connector calls below (``kv_connector_no_forward``).
   d. ``start_load_kv`` (after the launch): submits this step's load jobs.
   e. ``wait_for_save``: *queues* this step's store jobs (submitted in 3a of the next step).
   f. ``get_transfer_results`` -> ``get_finished``: the worker is polled at host time
      ``now``; it returns every job whose ``end_s <= now`` (heads of the per-direction FIFOs).
   g. ``build_connector_worker_meta``; ``clear_connector_metadata``.
   h. ``ModelRunnerOutput``: one sampled token (id 1) for every scheduled request that is not
      a partial prefill chunk (``request.is_prefill_chunk`` false right after ``schedule``),
      an empty list for a partial chunk; ``KVConnectorOutput`` with ``finished_recving``
      (async loads), ``finished_sending`` empty, and the worker metadata. An empty step
      yields ``ModelRunnerOutput.with_kv_conn_output_only``.
4. Sync (``async_scheduling=False``, ``EngineCore.step``): the host waits for the forward,
   ``now = max(now, end_s)``, then ``update_from_output``. Async (``async_scheduling=True``,
   ``EngineCore.step_with_batch_queue`` with ``max_concurrent_batches`` = 2): the batch is
   queued; when the queue is not full and (the step executed or the scheduler has requests)
   the iteration ends and the next ``schedule`` runs at the same host time, while this
   forward is still running; otherwise the oldest batch is popped, the host waits for its
   forward (``now = max(now, its end_s)``) and ``update_from_output`` processes it. With no
   scheduler work left but a batch still queued, the iteration only pops (no ``schedule``).
5. Idle rule: when an iteration added no request, scheduled no token, popped no batch with
   tokens, polled no finished transfer (in either batch it touched), stalled on no flush and
   left no store job queued in the worker, the clock jumps to the earliest of the next
   arrival and the next completion of a submitted transfer (vLLM's busy loop would poll
   every millisecond; its 1 ms sleep is not modelled). The jump is skipped when, in the async
   loop, a batch is queued and the scheduler has no work (the next iteration pops it at
   once). No such event left with work pending raises ``RuntimeError`` (a deadlock).

Timing conventions (the shared time model)
------------------------------------------
* Forward of a step: ``step_s + per_token_s * tokens scheduled in it``; forwards are
  serialized on one GPU stream. In the sync loop the next ``schedule`` runs at the previous
  forward's end, so forwards are back to back only while there is work. In the async loop,
  ``schedule(N+1)`` runs at the host time of ``update_from_output(N-1)`` (normally
  ``end_s(N-1)``), before forward N has ended, and forward N+1 starts at ``end_s(N)``.
* A transfer job moves ``blocks * gpu_block_tokens * kv_bytes_per_token`` bytes, where
  ``blocks`` is the number of GPU blocks in its ``GPULoadStoreSpec`` (loads: the
  destination blocks, which skip the GPU-cached head of a partly cached chunk; stores: every
  GPU block of every accepted chunk). Duration ``bytes / h2d_bytes_per_s`` for loads and
  ``bytes / d2h_bytes_per_s`` for stores; no per-job overhead.
* Queues: loads, stores (and expedited loads, unused) are three independent FIFOs. A job
  starts at ``max(submit host time, end of the last forward launched before its
  submission, end of the previous job in its FIFO)`` (the stream waits for the compute
  stream, then for its predecessor).
  - A store offered in step N (``build_connector_meta`` of N, its chunk's last token
    scheduled in N) is submitted at ``handle_preemptions`` of step N+1, before forward N+1 is
    launched, so it starts no earlier than ``end_s(N)`` (sync: ``now`` of step N+1, which
    is ``>= end_s(N)``; async: schedule N+1 runs before forward N ends, and the store
    waits for it). A store flushed by step M's ``jobs_to_flush`` is submitted (if it was
    not yet) in M's ``handle_preemptions`` and the host waits for its end before forward M
    is launched.
  - A load allocated in step N (the request is admitted into ``WAITING_FOR_REMOTE_KVS`` by
    ``schedule`` N) is submitted after forward N's launch, so it starts no earlier than
    ``end_s(N)``; in a step with no forward, no earlier than the previous forward's end and
    the step's host time.
* Completion visibility: a job with ``end_s = c`` is reported by the first poll (3f) at a
  host time ``>= c``; that poll's results reach the scheduler in ``update_from_output`` of the
  same batch (sync: at ``end_s`` of that step; async: when that batch is popped, normally
  one step later). A load's request is promoted (``WAITING_FOR_REMOTE_KVS`` -> ``WAITING``)
  and can be scheduled in the first ``schedule`` after that ``update_from_output``; a
  store's chunks become ``HIT`` (and its fence is released) for lookups from that
  ``schedule`` on.
* Tokens: a request's token sampled in step N exists at ``end_s(N)``:
  ``first_token_s``/``finish_s`` are that forward end and ``first_token_step``/
  ``finish_step`` that step's index (the scheduler learns of it at ``update_from_output``
  of N, ``StepRecord.processed_s``).
* Step indices count every ``schedule()`` call, including steps that scheduled nothing.

Hits (``RequestRecord.gpu_hit_tokens`` / ``cpu_hit_tokens``) are vLLM's own
``PrefillStats`` of the request's first admission (``num_local_cached_tokens`` and
``num_external_cached_tokens``, recorded at the ``schedule`` that admits the request: it is
scheduled, or enters ``WAITING_FOR_REMOTE_KVS``). GPU hit: whole GPU blocks, at most
``num_tokens - 1``. CPU hit: from the end of the GPU hit to the end of the last consecutive
CPU-resident chunk, scanning from the chunk that contains the GPU hit's end; it may reach
``num_tokens`` (vLLM then recomputes the last token after the load), and is 0 when it
would add less than one chunk. Only the GPU blocks past the GPU hit are copied.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from vllm.config import (
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
)
from vllm.v1.kv_offload.base import (
    GPULoadStoreSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from kvsim.integrations.vllm_engine_setup import (
    SAMPLED_TOKEN,
    RequestRecord,
    SimClock,
    SimTransferWorker,
    StepRecord,
    TransferRecord,
    VllmRun,
    build_vllm_config,
    finish_order_pinned,
    kv_cache_config,
    prompt_tokens,
    quiet_vllm,
)
from kvsim.traces.model import Request

# --------------------------------------------------------------------------- the engine


@dataclass
class _Batch:
    step: StepRecord
    output: SchedulerOutput
    model_output: ModelRunnerOutput
    ready_s: float  # when its ModelRunnerOutput is available (forward end)
    progress: bool  # tokens, finished transfers, a flush stall or queued stores


@dataclass
class _Params:
    step_s: float
    per_token_s: float
    page_bytes: int
    max_steps: int


class _Engine:
    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_config: KVCacheConfig,
        gpu_block_tokens: int,
        params: _Params,
        h2d: float,
        d2h: float,
    ) -> None:
        self.vllm_config = vllm_config
        self.p = params
        self.clock = SimClock()
        self.transfers: dict[int, TransferRecord] = {}
        self.steps: list[StepRecord] = []
        self.records: dict[int, RequestRecord] = {}
        self._unadmitted: set[str] = set()
        sched_cls = finish_order_pinned(vllm_config.scheduler_config.get_scheduler_cls())
        self.scheduler: Scheduler = sched_cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=gpu_block_tokens,
            hash_block_size=gpu_block_tokens,
            log_stats=False,
        )
        self.scheduler_class = sched_cls.__mro__[1].__name__
        self.batch_queue_size = vllm_config.max_concurrent_batches
        self.sim_worker: SimTransferWorker | None = None
        self.worker_connector: OffloadingConnector | None = None
        self.num_cpu_chunks = 0
        if vllm_config.kv_transfer_config is not None:
            wc = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.WORKER, kv_config)
            assert isinstance(wc, OffloadingConnector) and wc.connector_worker is not None
            self.sim_worker = SimTransferWorker(self.clock, self.transfers, h2d, d2h)
            wc.connector_worker.worker = self.sim_worker  # instead of register_kv_caches
            self.worker_connector = wc
            sc = self.scheduler.connector
            assert isinstance(sc, OffloadingConnector)
            self.num_cpu_chunks = sc.scheduler.manager._num_chunks  # type: ignore[attr-defined]

    # -- worker side ---------------------------------------------------------------

    def _record_jobs(
        self, so: SchedulerOutput, step: int
    ) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], tuple[int, ...]]:
        meta = so.kv_connector_metadata
        if meta is None:
            return (), (), ()
        assert isinstance(meta, OffloadingConnectorMetadata)
        loads: list[tuple[int, int]] = []
        stores: list[tuple[int, int]] = []
        for kind, jobs, out in (
            ("load", meta.load_jobs, loads),
            ("store", meta.store_jobs, stores),
        ):
            for job_id, job in jobs.items():
                spec = job.dst_spec if kind == "load" else job.src_spec
                assert isinstance(spec, GPULoadStoreSpec)
                blocks = len(spec.block_ids)
                self.transfers[job_id] = TransferRecord(
                    job_id, kind, int(job.req_id), blocks, blocks * self.p.page_bytes, step
                )
                out.append((job_id, blocks))
        return tuple(loads), tuple(stores), tuple(sorted(meta.jobs_to_flush or ()))

    def _execute(self, so: SchedulerOutput, rec: StepRecord) -> _Batch:
        clock = self.clock
        clock.step = rec.index
        tokens = so.total_num_scheduled_tokens
        requests = self.scheduler.requests
        sampled = {rid for rid in so.num_scheduled_tokens if not requests[rid].is_prefill_chunk}
        wc = self.worker_connector
        kvo: KVConnectorOutput | None = None
        t0 = clock.now
        if wc is not None:
            meta = so.kv_connector_metadata
            assert meta is not None
            wc.handle_preemptions(meta)
            wc.bind_connector_metadata(meta)
            if so.has_sync_kv_loads:
                wc.start_load_kv(None)  # type: ignore[arg-type]  # unused by the connector
        rec.stall_s = clock.now - t0
        if tokens > 0:
            rec.start_s = max(clock.now, clock.compute_tail)
            # the duration first, then the end: kvsim's engine adds them so, and an arrival
            # or a copy's end that ties with this end must fall on the same side of it
            rec.end_s = rec.start_s + (self.p.step_s + self.p.per_token_s * tokens)
            clock.compute_tail = rec.end_s
        else:
            rec.start_s = rec.end_s = clock.now
        progress = tokens > 0 or rec.stall_s > 0
        if wc is not None:
            if not so.has_sync_kv_loads:
                wc.start_load_kv(None)  # type: ignore[arg-type]
            wc.wait_for_save()
            results = wc.get_transfer_results(so.finished_req_ids)
            kvo = KVConnectorOutput(
                finished_sending=results.finished_sending,
                finished_recving=results.finished_recving,
                failed_recving=results.failed_recving,
                invalid_block_ids=wc.get_block_ids_with_load_errors(),
                kv_connector_worker_meta=wc.build_connector_worker_meta(),
            )
            wc.clear_connector_metadata()
            worker_meta = kvo.kv_connector_worker_meta
            if isinstance(worker_meta, OffloadingWorkerMetadata):
                rec.finished_jobs = tuple(sorted(worker_meta.completed_jobs))
            rec.finished_recving = tuple(sorted(int(r) for r in kvo.finished_recving or ()))
            progress |= bool(rec.finished_jobs) or self._unsubmitted_stores() > 0
        rec.sampled = tuple(sorted(int(r) for r in sampled))
        if tokens > 0:
            ids = list(so.num_scheduled_tokens)
            mro = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[SAMPLED_TOKEN] if r in sampled else [] for r in ids],
                kv_connector_output=kvo,
            )
        else:
            mro = ModelRunnerOutput.with_kv_conn_output_only(kvo)
        return _Batch(rec, so, mro, rec.end_s, progress)

    def _unsubmitted_stores(self) -> int:
        """Store jobs queued by ``wait_for_save``, submitted at the next step's start."""
        wc = self.worker_connector
        if wc is None or wc.connector_worker is None:
            return 0
        return len(wc.connector_worker._unsubmitted_store_jobs)

    # -- scheduler side -------------------------------------------------------------

    def _schedule_and_execute(self) -> _Batch:
        index = len(self.steps)
        now = self.clock.now
        so = self.scheduler.schedule()
        self._record_admissions(index)
        loads, stores, flushed = self._record_jobs(so, index)
        rec = StepRecord(
            index=index,
            schedule_s=now,
            start_s=now,
            end_s=now,
            scheduled={int(r): n for r, n in so.num_scheduled_tokens.items()},
            preempted=tuple(sorted(int(r) for r in so.preempted_req_ids or ())),
            load_jobs=loads,
            store_jobs=stores,
            flushed_jobs=flushed,
            stall_s=0.0,
        )
        for r in rec.preempted:
            self.records[r].preemptions += 1
        self.steps.append(rec)
        return self._execute(so, rec)

    def _record_admissions(self, index: int) -> None:
        if not self._unadmitted:
            return
        done = []
        for rid in self._unadmitted:
            req = self.scheduler.requests.get(rid)
            if req is None or req.status == RequestStatus.WAITING:
                continue
            rec = self.records[int(rid)]
            rec.admitted_step = index
            stats = req.prefill_stats
            if stats is not None:
                rec.gpu_hit_tokens = stats.num_local_cached_tokens
                rec.cpu_hit_tokens = stats.num_external_cached_tokens
            done.append(rid)
        self._unadmitted.difference_update(done)

    def _update(self, batch: _Batch) -> None:
        """``update_from_output`` at the current host time; records the tokens it emits."""
        rec = batch.step
        rec.processed_s = self.clock.now
        outs = self.scheduler.update_from_output(batch.output, batch.model_output)
        for eco in outs.values():
            for o in eco.outputs:
                r = self.records[int(o.request_id)]
                if o.new_token_ids:
                    if r.generated_tokens == 0:
                        r.first_token_step, r.first_token_s = rec.index, rec.end_s
                    r.generated_tokens += len(o.new_token_ids)
                if o.finish_reason is not None:
                    r.finish_step, r.finish_s = rec.index, rec.end_s

    # -- loop -------------------------------------------------------------------------

    def run(
        self, requests: Sequence[Request], make: Callable[[Request], VllmRequest]
    ) -> tuple[bool, float]:
        """The loop; ``make`` builds a request's vLLM ``Request`` when it arrives."""
        clock = self.clock
        pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.request_id)))
        queue: deque[_Batch] = deque()
        sched = self.scheduler
        if pending:
            clock.now = pending[0].arrival_s
        while True:
            progress = False
            while pending and pending[0].arrival_s <= clock.now:
                vreq = make(pending.popleft())
                sched.add_request(vreq)
                self._unadmitted.add(vreq.request_id)
                progress = True
            if not (sched.has_requests() or queue):
                if not pending:
                    return True, clock.now
                clock.now = max(clock.now, pending[0].arrival_s)
                continue
            if len(self.steps) >= self.p.max_steps:
                return False, clock.now
            if self.batch_queue_size <= 1:  # EngineCore.step
                batch = self._schedule_and_execute()
                clock.now = max(clock.now, batch.ready_s)
                self._update(batch)
                progress |= batch.progress
            else:  # EngineCore.step_with_batch_queue
                if sched.has_requests():
                    batch = self._schedule_and_execute()
                    queue.appendleft(batch)
                    if len(queue) < self.batch_queue_size and (
                        batch.step.num_tokens > 0 or sched.has_requests()
                    ):
                        continue
                    progress |= batch.progress
                done = queue.pop()
                clock.now = max(clock.now, done.ready_s)
                self._update(done)
                progress |= done.progress
            # async: a batch left in the queue with no scheduler work is popped at once
            # by the next step_with_batch_queue; only jump when the next iteration would spin
            if not progress and (not queue or sched.has_requests()):
                self._jump(pending)

    def _jump(self, pending: deque[Request]) -> None:
        clock = self.clock
        nxt = pending[0].arrival_s if pending else math.inf
        if self.sim_worker is not None:
            nxt = min(nxt, self.sim_worker.next_completion())
        if nxt == math.inf:
            if not self.scheduler.has_requests():
                return  # nothing left: the loop ends at its next check
            raise RuntimeError(
                f"vLLM engine idle with work left at t={clock.now} (step {len(self.steps)}): "
                f"{len(self.scheduler.running)} running, {len(self.scheduler.waiting)} waiting, "
                f"{len(self.scheduler.kv_holding_waiting)} holding KV"
            )
        clock.now = max(clock.now, nxt)


def rebased(requests: Sequence[Request]) -> list[Request]:
    """The requests with arrivals counted from the first one, as kvsim's timed mode counts
    them (:mod:`kvsim.engine.arrivals`): both clocks start at 0."""
    if not requests:
        return []
    origin = min(r.arrival_s for r in requests)
    return [dataclasses.replace(r, arrival_s=r.arrival_s - origin) for r in requests]


def run_vllm_engine(
    requests: Sequence[Request],
    *,
    block_tokens: int,
    gpu_blocks: int,
    gpu_block_tokens: int = 16,
    chunk_tokens: int | None = None,
    cpu_chunks: int | None = None,
    policy: str = "lru",
    store_threshold: int = 0,
    kv_bytes_per_token: int = 131_072,
    step_s: float = 0.01,
    per_token_s: float = 1e-5,
    h2d_bytes_per_s: float = 25e9,
    d2h_bytes_per_s: float = 25e9,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    long_prefill_token_threshold: int = 0,
    async_scheduling: bool = False,
    enable_chunked_prefill: bool = True,
    max_model_len: int | None = None,
    max_steps: int = 200_000,
) -> VllmRun:
    """Run ``requests`` through vLLM 0.33's engine-side code on the shared time model (see
    the module docstring for every convention). ``cpu_chunks=None``: no offloading
    connector; otherwise a CPU tier of ``cpu_chunks`` chunks of ``chunk_tokens`` tokens
    (default ``block_tokens``)."""
    if block_tokens % gpu_block_tokens:
        raise ValueError(f"gpu_block_tokens {gpu_block_tokens} must divide {block_tokens}")
    chunk = block_tokens if chunk_tokens is None else chunk_tokens
    if chunk % gpu_block_tokens:
        raise ValueError(f"chunk_tokens {chunk} must be a multiple of {gpu_block_tokens}")
    if cpu_chunks is not None and cpu_chunks < 1:
        raise ValueError("cpu_chunks must be >= 1 (None disables offloading)")
    if kv_bytes_per_token < 2:
        raise ValueError("kv_bytes_per_token must be >= 2")
    page_bytes = gpu_block_tokens * kv_bytes_per_token
    requests = rebased(requests)
    if gpu_blocks < 2:
        raise ValueError("gpu_blocks must be >= 2 (block 0 is vLLM's null block)")
    mml = (gpu_blocks - 1) * gpu_block_tokens if max_model_len is None else max_model_len
    if not enable_chunked_prefill:  # vLLM then refuses max_model_len > max_num_batched_tokens
        mml = min(mml, max_num_batched_tokens)
    with quiet_vllm():
        vllm_config = build_vllm_config(
            max_model_len=mml,
            gpu_block_tokens=gpu_block_tokens,
            chunk_tokens=chunk,
            cpu_chunks=cpu_chunks,
            page_bytes=page_bytes,
            policy=policy,
            store_threshold=store_threshold,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            long_prefill_token_threshold=long_prefill_token_threshold,
            async_scheduling=async_scheduling,
            enable_chunked_prefill=enable_chunked_prefill,
        )
        kv_config = kv_cache_config(gpu_blocks, gpu_block_tokens, page_bytes)
        vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
        engine = _Engine(
            vllm_config,
            kv_config,
            gpu_block_tokens,
            _Params(step_s, per_token_s, page_bytes, max_steps),
            h2d_bytes_per_s,
            d2h_bytes_per_s,
        )
        if cpu_chunks is not None and engine.num_cpu_chunks != cpu_chunks:
            raise AssertionError(f"CPU tier has {engine.num_cpu_chunks} chunks, not {cpu_chunks}")
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(gpu_block_tokens, hash_fn)
        token_cache: dict[int, np.ndarray] = {}

        def make(req: Request) -> VllmRequest:
            return VllmRequest(
                request_id=str(req.request_id),
                prompt_token_ids=prompt_tokens(req, block_tokens, token_cache),
                sampling_params=SamplingParams(
                    max_tokens=engine.records[req.request_id].output_tokens, ignore_eos=True
                ),
                pooling_params=None,
                arrival_time=req.arrival_s,
                block_hasher=hasher,
            )

        accepted: list[Request] = []
        for req in requests:
            out = max(1, req.output_tokens)
            rec = RequestRecord(req.request_id, req.arrival_s, req.input_tokens, out)
            if req.request_id in engine.records:
                raise ValueError(f"duplicate request_id {req.request_id}")
            engine.records[req.request_id] = rec
            if req.input_tokens < 1 or req.input_tokens + out > mml:
                rec.rejected = True
            else:
                accepted.append(req)
        complete, end_s = engine.run(accepted, make)
    return VllmRun(
        steps=engine.steps,
        requests=engine.records,
        transfers=engine.transfers,
        max_model_len=mml,
        num_cpu_chunks=engine.num_cpu_chunks,
        async_scheduling=async_scheduling,
        batch_queue_size=engine.batch_queue_size,
        scheduler_class=engine.scheduler_class,
        end_s=end_s,
        complete=complete,
    )


__all__ = [
    "RequestRecord",
    "SimTransferWorker",
    "StepRecord",
    "TransferRecord",
    "VllmRun",
    "prompt_tokens",
    "run_vllm_engine",
]
