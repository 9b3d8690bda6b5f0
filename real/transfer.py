"""The real transfer backend: the engine's submit / poll / wait protocol over real copies.

One side stream per direction (store, load, expedited load), so each direction runs its
jobs strictly FIFO while the directions overlap (PCIe is full duplex). Per job:

1. the GPU blocks and host chunks are paired as vLLM does (the job's blocks fill the
   *last* ``len(gpu_blocks)`` sub-blocks of its chunks, so a partial first chunk skips
   its head);
2. one page descriptor per (block, layer) is built, then runs contiguous on both sides
   are merged into a single ``copy_`` (one DMA each on CUDA);
3. a store waits for the compute stream (the KV it reads was written there); any job
   waits for in-flight jobs of other directions that touch the same GPU block or host
   chunk with a conflicting access, so memory is never reused before its copy's event;
4. start and end events are recorded around the copies; ``poll`` reports a direction's
   head only once its end event completed, so completions are in submission order;
5. a copy that raises ends the job with ``success=False`` (the engine then calls
   ``complete_store(success=False)``, which frees the chunk).

After every successful load each destination block is compared byte for byte with the
pattern of its key (see :mod:`real.kv_cache`); the counts land in ``integrity``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvsim.engine.transfer_protocol import DIRECTIONS, STORE, TransferJob, TransferResult
from real.device import Device, Event, Stream, as_cuda_stream
from real.host_pool import HostPool
from real.kv_cache import GpuKVCache

Fault = Callable[[TransferJob], bool]
Pair = tuple[int, int, int, object]  # (gpu block, chunk, sub-block, identity or None)
Resource = tuple[str, int]  # ("g", gpu block) or ("h", chunk)
Run = tuple[int, int, int]  # (dst, src, words)


class InjectedCopyError(RuntimeError):
    """Raised inside a copy by a test's fault hook."""


@dataclass
class Integrity:
    """Byte-for-byte checks of loaded blocks."""

    checked_blocks: int = 0
    unchecked_blocks: int = 0  # loads whose job carried no keys
    mismatched_blocks: int = 0
    mismatched_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class JobRecord:
    """What one job did and how long it took (the raw material of the validation report)."""

    job_id: int
    direction: str
    nbytes: int  # bytes actually copied (blocks x block bytes)
    blocks: int
    descriptors: int  # page copies before coalescing (blocks x layers or blocks)
    copies: int  # copy_ calls after coalescing
    submit_time: float
    start_time: float = 0.0
    end_time: float = 0.0
    success: bool = True
    error: str | None = None
    mismatched_blocks: int = 0
    keys: tuple[object, ...] = ()

    @property
    def duration(self) -> float:
        return self.end_time - self.start_time


@dataclass
class _InFlight:
    job: TransferJob
    pairs: list[Pair]
    record: JobRecord
    start: Event
    end: Event
    resources: list[tuple[Resource, bool]] = field(default_factory=list)
    error: str | None = None


def coalesce(descs: Sequence[Run]) -> list[Run]:
    """Merge ``(dst, src, size)`` descriptors that continue the previous one on both sides."""
    runs: list[list[int]] = []
    for dst, src, size in descs:
        if runs:
            last = runs[-1]
            if last[0] + last[2] == dst and last[1] + last[2] == src:
                last[2] += size
                continue
        runs.append([dst, src, size])
    return [(d, s, n) for d, s, n in runs]


class RealTransferBackend:
    """Moves bytes between ``gpu_cache`` and ``host_pool`` on ``device``'s streams."""

    def __init__(
        self,
        device: Device,
        gpu_cache: GpuKVCache,
        host_pool: HostPool,
        *,
        fill_on_store: bool = True,
        verify_loads: bool = True,
        fault: Fault | None = None,
    ) -> None:
        if gpu_cache.geometry != host_pool.layout.geometry:
            raise ValueError("the GPU cache and the host pool have different block geometry")
        self.device = device
        self.gpu = gpu_cache
        self.host = host_pool
        self.units_per_chunk = host_pool.layout.units_per_chunk
        self.fill_on_store = fill_on_store
        self.verify_loads = verify_loads
        self.fault = fault
        self.streams = {d: device.new_stream(d) for d in DIRECTIONS}
        self._queues: dict[str, deque[_InFlight]] = {d: deque() for d in DIRECTIONS}
        self._by_id: dict[int, _InFlight] = {}
        self._touching: dict[Resource, list[tuple[_InFlight, bool]]] = {}
        self._ready: list[TransferResult] = []
        self._compute_ordered: set[int] = set()
        self.integrity = Integrity()
        self.records: list[JobRecord] = []

    # ------------------------------------------------------------------ planning

    def _pairs(self, job: TransferJob) -> list[Pair]:
        upc = self.units_per_chunk
        blocks, chunks, keys = list(job.gpu_blocks), list(job.chunk_ids), list(job.keys)
        skip = len(chunks) * upc - len(blocks)
        if not 0 <= skip < max(upc, 1) or (not chunks and blocks):
            raise ValueError(
                f"job {job.job_id}: {len(blocks)} GPU blocks do not fit "
                f"{len(chunks)} chunks of {upc} blocks"
            )
        by_chunk = len(keys) == len(chunks) and bool(keys)
        by_block = not by_chunk and len(keys) == len(blocks) and bool(keys)
        pairs: list[Pair] = []
        for i, b in enumerate(blocks):
            if not 0 <= b < self.gpu.num_blocks:
                raise ValueError(f"job {job.job_id}: GPU block {b} out of range")
            pos = i + skip
            c, sub = chunks[pos // upc], pos % upc
            if not 0 <= c < self.host.num_chunks:
                raise ValueError(f"job {job.job_id}: chunk {c} out of range")
            ident = (
                (keys[pos // upc], sub) if by_chunk else (("unit", keys[i]) if by_block else None)
            )
            pairs.append((b, c, sub, ident))
        return pairs

    def _descriptors(self, pairs: Sequence[Pair], to_host: bool) -> list[Run]:
        """Page descriptors ``(dst, src, words)`` in an order that lets runs merge."""
        g = self.gpu.geometry
        gpu_off, host_off = self.gpu.page_offset, self.host.layout.page_offset
        descs: list[Run] = []
        if self.gpu.layout == "layer_major":
            order = [(layer, p) for layer in range(g.num_layers) for p in pairs]
        else:
            order = [(layer, p) for p in pairs for layer in range(g.num_layers)]
        for layer, (b, c, sub, _) in order:
            go, ho = gpu_off(b, layer), host_off(c, sub, layer)
            descs.append((ho, go, g.page_words) if to_host else (go, ho, g.page_words))
        return descs

    # ------------------------------------------------------------------ hazards

    def _resources(self, direction: str, pairs: Sequence[Pair]) -> list[tuple[Resource, bool]]:
        """(resource, writes) for the job: a store reads GPU blocks and writes chunks."""
        store = direction == STORE
        res = {(("g", b), not store) for b, _, _, _ in pairs}
        res |= {(("h", c), store) for _, c, _, _ in pairs}
        return sorted(res, key=lambda r: (r[0][0], r[0][1]))

    def _conflicts(
        self, direction: str, resources: Sequence[tuple[Resource, bool]]
    ) -> list[_InFlight]:
        found: dict[int, _InFlight] = {}
        for res, writes in resources:
            for other, other_writes in self._touching.get(res, ()):
                if other.job.direction != direction and (writes or other_writes):
                    found[other.job.job_id] = other
        return list(found.values())

    def _release(self, inflight: _InFlight) -> None:
        for res, _ in inflight.resources:
            lst = self._touching.get(res)
            if lst is None:
                continue
            lst[:] = [e for e in lst if e[0] is not inflight]
            if not lst:
                del self._touching[res]

    def wait_blocks_free(self, stream: Stream, gpu_blocks: Sequence[int]) -> None:
        """Order later work on ``stream`` after every in-flight job touching these blocks."""
        seen: set[int] = set()
        for b in gpu_blocks:
            for other, _ in self._touching.get(("g", b), ()):
                if other.job.job_id not in seen:
                    seen.add(other.job.job_id)
                    stream.wait_event(other.end)

    # ------------------------------------------------------------------ compute side

    def fill_blocks(self, gpu_blocks: Sequence[int], idents: Sequence[object]) -> None:
        """Emulate compute writing these blocks: their key patterns, on the compute stream."""
        compute = self.device.compute_stream
        self.wait_blocks_free(compute, gpu_blocks)
        gpu = self.gpu
        items = [(b, i) for b, i in zip(gpu_blocks, idents) if i is not None]

        def fill() -> None:
            for b, ident in items:
                gpu.fill(b, ident)

        compute.run(fill)

    def order_compute_after_loads(self) -> None:
        """Compute enqueued from now on reads loaded blocks only after their copies."""
        compute = self.device.compute_stream
        for direction in DIRECTIONS:
            if direction == STORE:
                continue
            for inflight in self._queues[direction]:
                jid = inflight.job.job_id
                if jid not in self._compute_ordered:
                    self._compute_ordered.add(jid)
                    compute.wait_event(inflight.end)

    # ------------------------------------------------------------------ protocol

    def submit(self, job: TransferJob, now: float) -> None:
        if job.direction not in DIRECTIONS:
            raise ValueError(f"unknown transfer direction {job.direction!r}")
        if job.job_id in self._by_id:
            raise ValueError(f"job id {job.job_id} is already in flight")
        pairs = self._pairs(job)
        to_host = job.direction == STORE
        descs = self._descriptors(pairs, to_host)
        runs = coalesce(descs)
        record = JobRecord(
            job.job_id,
            job.direction,
            len(pairs) * self.gpu.geometry.block_bytes,
            len(pairs),
            len(descs),
            len(runs),
            submit_time=self.device.clock(),
            keys=tuple(job.keys),
        )
        stream = self.streams[job.direction]
        if to_host:
            if self.fill_on_store:
                self.fill_blocks([p[0] for p in pairs], [p[3] for p in pairs])
            stream.wait_stream(self.device.compute_stream)
        resources = self._resources(job.direction, pairs)
        for other in self._conflicts(job.direction, resources):
            stream.wait_event(other.end)
        start, end = self.device.new_event(), self.device.new_event()
        inflight = _InFlight(job, pairs, record, start, end, resources)
        inflight.start.record(stream)
        stream.run(self._copy_fn(inflight, runs, to_host))
        inflight.end.record(stream)
        for res, writes in inflight.resources:
            self._touching.setdefault(res, []).append((inflight, writes))
        self._queues[job.direction].append(inflight)
        self._by_id[job.job_id] = inflight

    def _copy_fn(
        self, inflight: _InFlight, runs: Sequence[Run], to_host: bool
    ) -> Callable[[], None]:
        gpu_flat, host_flat = self.gpu.flat, self.host.data
        dst, src = (host_flat, gpu_flat) if to_host else (gpu_flat, host_flat)
        non_blocking = self.device.is_cuda
        fail = self.fault is not None and self.fault(inflight.job)

        def copy() -> None:
            try:
                for i, (d, s, n) in enumerate(runs):
                    if fail and i >= len(runs) // 2:
                        raise InjectedCopyError(f"injected failure in job {inflight.job.job_id}")
                    dst[d : d + n].copy_(src[s : s + n], non_blocking=non_blocking)
            except Exception as exc:  # a failed copy is a result, not a crash
                inflight.error = f"{type(exc).__name__}: {exc}"

        return copy

    def _finish(self, inflight: _InFlight) -> TransferResult:
        job, rec = inflight.job, inflight.record
        rec.start_time = inflight.start.time()
        rec.end_time = inflight.end.time()
        rec.success = inflight.error is None
        rec.error = inflight.error
        if rec.success and job.direction != STORE and self.verify_loads:
            self._verify(inflight)
        self._release(inflight)
        self._by_id.pop(job.job_id, None)
        self._compute_ordered.discard(job.job_id)
        self.records.append(rec)
        return TransferResult(
            job.job_id,
            job.direction,
            rec.success,
            job.nbytes,
            rec.start_time,
            rec.end_time,
            job.submit_time,
        )

    def _verify(self, inflight: _InFlight) -> None:
        integ, rec = self.integrity, inflight.record
        stream = self.streams[inflight.job.direction]
        for b, _, _, ident in inflight.pairs:
            if ident is None:
                integ.unchecked_blocks += 1
                continue
            if self.device.is_cuda:  # after the copy on its own stream; .item() waits for it
                with torch.cuda.stream(as_cuda_stream(stream).raw):
                    bad = self.gpu.mismatched_bytes(b, ident)
            else:  # the end event fired, so the bytes are in place; later queued work has not run
                bad = self.gpu.mismatched_bytes(b, ident)
            integ.checked_blocks += 1
            if bad:
                integ.mismatched_blocks += 1
                integ.mismatched_bytes += bad
                rec.mismatched_blocks += 1

    def poll(self, now: float) -> list[TransferResult]:
        out, self._ready = self._ready, []
        for direction in DIRECTIONS:
            q = self._queues[direction]
            while q and q[0].end.query():
                out.append(self._finish(q.popleft()))
        return out

    def wait(self, job_ids: Sequence[int], now: float) -> tuple[float, list[TransferResult]]:
        """Block on the jobs' end events; like the simulated backend, the results are
        returned here *and* still reported once by the next ``poll``."""
        wanted = set(job_ids)
        for jid in wanted:
            inflight = self._by_id.get(jid)
            if inflight is not None:
                inflight.end.synchronize()
        for direction in DIRECTIONS:
            q = self._queues[direction]
            while q and q[0].end.query():
                self._ready.append(self._finish(q.popleft()))
        return self.device.clock(), [r for r in self._ready if r.job_id in wanted]

    def next_completion_time(self) -> float | None:
        return None

    # ------------------------------------------------------------------ helpers

    @property
    def in_flight(self) -> int:
        return len(self._by_id)

    def drain(self) -> list[TransferResult]:
        """Wait for every job; returns the results not yet reported."""
        self.wait(list(self._by_id), self.device.clock())
        out, self._ready = self._ready, []
        return out
