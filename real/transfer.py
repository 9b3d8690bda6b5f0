"""The real transfer backend: the engine's submit / poll / wait protocol over real copies.

One side stream per direction (store, load, expedited load), so each direction runs its
jobs strictly FIFO while the directions overlap (PCIe is full duplex). Per job, as vLLM
0.33's ``SingleDirectionOffloadingHandler.transfer_async`` does:

1. the GPU blocks and host chunks are paired as vLLM does (the job's blocks fill the
   *last* ``len(gpu_blocks)`` sub-blocks of its chunks, so a partial first chunk skips
   its head);
2. one page descriptor per (block, layer) is built, then runs contiguous on both sides
   are merged (never across a host registration piece) and handed to the device's copy
   path (one batched ``cuMemcpyBatchAsync`` on CUDA, see :mod:`real.copy_path`);
3. the job's stream waits for the compute stream, loads included (vLLM: pending writes
   to the destination blocks, e.g. zeroing, come first); a job also waits for in-flight
   jobs of other directions that touch the same GPU block or host chunk with a
   conflicting access, so memory is never reused before an earlier job is done with it.
   The compute stream never waits for loads: like vLLM's scheduler, the engine runs a
   request only after ``poll`` reported its load finished;
4. start and end events are recorded around the copies, which the copy path enqueues
   from the host at submission; ``poll`` reports a direction's head only once its end event
   completed, so completions are in submission order. A job's duration is measured from
   its start event to its end event (never as a difference of two absolute times, whose
   float32 quantum grows as the run goes on, see :mod:`real.device`);
5. a copy that raises ends the job with ``success=False`` (the engine then calls
   ``complete_store(success=False)``, which frees the chunk).

When the backend starts it has the copy path compile what its jobs will run (the gather
kernel's tile for its page size), so no compile lands inside a timed job.

Integrity: a store first writes its blocks' key patterns on the compute stream (emulating
the forward that computed them; one batched fill per job). A load enqueues, right behind
its copies on its own stream, one batched comparison of all its blocks with their
patterns; the per-block mismatch counts go to host memory and a ``done`` event is recorded
after them. ``poll`` reads the counts only once that event completed, so nothing in
``poll`` waits for the device, and a later job into the same block (which waits for
``done``) can never be checked in its place. Block ids, seeds and counts travel through one
staging buffer allocated when the backend starts (pinned on CUDA; :mod:`real.staging`), a
slice reused only once the event after its last use completed and the host read it: no
page-locked allocation happens inside a job.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvsim.engine.transfer_protocol import DIRECTIONS, STORE, TransferJob, TransferResult
from real.copy_path import CopyPath, Run
from real.device import Device, Event, Stream
from real.host_pool import HostPool
from real.kv_cache import LAYER_MAJOR, GpuKVCache, key_seed
from real.staging import Lease, StagingBuffer

Fault = Callable[[TransferJob], bool]
Pair = tuple[int, int, int, object]  # (gpu block, chunk, sub-block, identity or None)
Resource = tuple[str, int]  # ("g", gpu block) or ("h", chunk)


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
    copies: int  # descriptors handed to the copy path after coalescing
    submit_time: float
    start_time: float = 0.0  # device clock: from the reference event (coarse late in a run)
    end_time: float = 0.0
    duration_s: float = 0.0  # start event to end event, measured between the two
    success: bool = True
    error: str | None = None
    mismatched_blocks: int = 0
    keys: tuple[object, ...] = ()

    @property
    def duration(self) -> float:
        """The job's measured copy time (``duration_s``)."""
        return self.duration_s


@dataclass
class _Check:
    """A load's pending byte check: counts land in ``out`` (host) before ``done`` fires;
    ``lease`` is the staging slice of its ids, seeds and counts."""

    out: torch.Tensor
    unchecked: int
    lease: Lease


@dataclass
class _InFlight:
    job: TransferJob
    pairs: list[Pair]
    record: JobRecord
    start: Event
    end: Event
    done: Event  # after the copies and the job's check: its memory is free again
    resources: list[tuple[Resource, bool]] = field(default_factory=list)
    error: str | None = None
    check: _Check | None = None
    finished: bool = False  # its result was handed out (poll / wait)


def coalesce(descs: Sequence[Run], piece_words: int | None = None, host_side: int = 0) -> list[Run]:
    """Merge ``(dst, src, size)`` descriptors that continue the previous one on both sides;
    never across a multiple of ``piece_words`` on the host side (index ``host_side``)."""
    runs: list[list[int]] = []
    for dst, src, size in descs:
        if runs:
            last = runs[-1]
            if last[0] + last[2] == dst and last[1] + last[2] == src:
                here = (dst, src)[host_side]
                if piece_words is None or here % piece_words != 0:
                    last[2] += size
                    continue
        runs.append([dst, src, size])
    return [(d, s, n) for d, s, n in runs]


def coalesce_arrays(
    dst: npt.NDArray[np.int64],
    src: npt.NDArray[np.int64],
    size: int,
    piece_words: int | None = None,
    host_side: int = 0,
) -> list[Run]:
    """:func:`coalesce` for descriptors of one ``size``, vectorised."""
    n = len(dst)
    if n == 0:
        return []
    brk = np.ones(n, dtype=bool)
    brk[1:] = (dst[1:] != dst[:-1] + size) | (src[1:] != src[:-1] + size)
    if piece_words is not None:
        here = (dst, src)[host_side]
        brk[1:] |= here[1:] % piece_words == 0
    starts = np.flatnonzero(brk)
    lengths = np.diff(np.append(starts, n)) * size
    return list(zip(dst[starts].tolist(), src[starts].tolist(), lengths.tolist()))


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
        copy_path: CopyPath | None = None,
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
        self.copy_path = copy_path or device.copy_path()
        # vLLM's copy descriptor: one layer's page (layer-major) or a whole cross-layer block
        g = gpu_cache.geometry
        self.page_words = g.page_words * (1 if gpu_cache.layout == LAYER_MAJOR else g.num_layers)
        self.streams = {d: device.stream(d) for d in DIRECTIONS}
        self._queues: dict[str, deque[_InFlight]] = {d: deque() for d in DIRECTIONS}
        self._by_id: dict[int, _InFlight] = {}
        self._touching: dict[Resource, list[tuple[_InFlight, bool]]] = {}
        self._unsettled: list[_InFlight] = []  # done event not yet seen
        self._ready: list[TransferResult] = []
        self.integrity = Integrity()
        self.records: list[JobRecord] = []
        self.jobs: dict[int, TransferJob] = {}  # every job submitted (to replay one alone)
        self.staging = StagingBuffer(device.staging_allocator())
        self.copy_path.prepare(self.page_words * g.word_bytes, device.torch_device)

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

    def _descriptors(
        self, pairs: Sequence[Pair], to_host: bool
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Page descriptors as (dst, src) word offsets, each ``page_words`` long, in an
        order that lets runs merge (numpy, as vLLM builds its descriptor arrays)."""
        g = self.gpu.geometry
        blocks = np.array([p[0] for p in pairs], dtype=np.int64)
        chunks = np.array([p[1] for p in pairs], dtype=np.int64)
        subs = np.array([p[2] for p in pairs], dtype=np.int64)
        layers = np.arange(g.num_layers, dtype=np.int64)
        if self.gpu.layout == "layer_major":  # layer outer, block inner
            b, c, j, layer = blocks[None, :], chunks[None, :], subs[None, :], layers[:, None]
        else:  # block outer, layer inner
            b, c, j, layer = blocks[:, None], chunks[:, None], subs[:, None], layers[None, :]
        shape = np.broadcast_shapes(b.shape, layer.shape)
        # the scalar offset functions are plain arithmetic, so they take arrays too
        gpu_page: Any = self.gpu.page_offset
        host_page: Any = self.host.layout.page_offset
        gpu_off = np.broadcast_to(gpu_page(b, layer), shape).ravel()
        host_off = np.broadcast_to(host_page(c, j, layer), shape).ravel()
        return (host_off, gpu_off) if to_host else (gpu_off, host_off)

    def _runs(self, pairs: Sequence[Pair], to_host: bool) -> tuple[int, list[Run]]:
        dst, src = self._descriptors(pairs, to_host)
        runs = coalesce_arrays(
            dst, src, self.gpu.geometry.page_words, self.host.piece_words, 0 if to_host else 1
        )
        return len(dst), runs

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
                    stream.wait_event(other.done)

    def busy_gpu_blocks(self) -> set[int]:
        """GPU blocks an unfinished job still reads or writes."""
        return {i for kind, i in self._touching if kind == "g"}

    def busy_chunks(self) -> set[int]:
        """Host chunks an unfinished job still reads or writes."""
        return {i for kind, i in self._touching if kind == "h"}

    # ------------------------------------------------------------------ device tensors

    def _stage_keys(self, pairs: Sequence[Pair], extra: int = 0) -> tuple[Lease, int, int]:
        """The keyed blocks' ids then their seeds in a staging slice (``extra`` more words
        after them); returns ``(lease, keyed blocks, unkeyed blocks)``."""
        keyed = [(b, key_seed(ident)) for b, _, _, ident in pairs if ident is not None]
        n = len(keyed)
        lease = self.staging.take(2 * n + extra)
        if n:
            ids = torch.tensor([v for kv in zip(*keyed) for v in kv], dtype=torch.int64)
            lease.words[: 2 * n].copy_(ids)
        return lease, n, len(pairs) - n

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device.torch_device, non_blocking=True)

    # ------------------------------------------------------------------ compute side

    def fill_blocks(self, pairs: Sequence[Pair]) -> None:
        """Emulate compute writing these blocks: their key patterns, on the compute stream,
        in one batched operation per job."""
        compute = self.device.compute_stream
        self.wait_blocks_free(compute, [p[0] for p in pairs])
        lease, n, _ = self._stage_keys(pairs)
        if not n:
            lease.release()
            return
        gpu, on_device, staged = self.gpu, self._on_device, lease.words

        def fill() -> None:
            both = on_device(staged)
            gpu.fill_many(both[:n], both[n:])

        compute.run(fill)
        fence = self.device.new_event()
        fence.record(compute)
        lease.guard(fence)

    def _enqueue_check(self, stream: Stream, pairs: Sequence[Pair]) -> _Check:
        """Queue the byte check of a load's blocks on its stream (``done`` guards the
        staging slice; ``_settle`` releases it once it read the counts)."""
        count = sum(1 for p in pairs if p[3] is not None)
        lease, n, unchecked = self._stage_keys(pairs, extra=count)
        out = lease.words[2 * n :]
        if n:
            gpu, on_device, staged = self.gpu, self._on_device, lease.words[: 2 * n]

            def check() -> None:
                both = on_device(staged)
                out.copy_(gpu.mismatch_counts(both[:n], both[n:]), non_blocking=True)

            stream.run(check)
        return _Check(out, unchecked, lease)

    # ------------------------------------------------------------------ protocol

    def submit(self, job: TransferJob, now: float) -> None:
        if job.direction not in DIRECTIONS:
            raise ValueError(f"unknown transfer direction {job.direction!r}")
        if job.job_id in self._by_id:
            raise ValueError(f"job id {job.job_id} is already in flight")
        pairs = self._pairs(job)
        to_host = job.direction == STORE
        n_descs, runs = self._runs(pairs, to_host)
        record = JobRecord(
            job.job_id,
            job.direction,
            len(pairs) * self.gpu.geometry.block_bytes,
            len(pairs),
            n_descs,
            len(runs),
            submit_time=self.device.clock(),
            keys=tuple(job.keys),
        )
        stream = self.streams[job.direction]
        if to_host and self.fill_on_store:
            self.fill_blocks(pairs)
        stream.wait_stream(self.device.compute_stream)
        resources = self._resources(job.direction, pairs)
        conflicts = self._conflicts(job.direction, resources)
        for other in conflicts:
            stream.wait_event(other.done)
        start, end = self.device.new_event(), self.device.new_event()
        inflight = _InFlight(job, pairs, record, start, end, end, resources)
        start.record(stream)
        chunks = {c for _, c, _, _ in pairs}
        stable = not to_host and not any(  # nothing in flight writes the source chunks
            o.job.direction == STORE and chunks & {c for _, c, _, _ in o.pairs} for o in conflicts
        )
        self._enqueue_copies(inflight, runs, to_host, stream, stable)
        end.record(stream)
        if not to_host and self.verify_loads:
            inflight.check = self._enqueue_check(stream, pairs)
            inflight.done = self.device.new_event()
            inflight.done.record(stream)
            lease = inflight.check.lease
            lease.guard(inflight.done, hold=True)
            lease.reclaim = lambda: self._read_check(inflight, wait=True)
        self.jobs[job.job_id] = job
        for res, writes in inflight.resources:
            self._touching.setdefault(res, []).append((inflight, writes))
        self._queues[job.direction].append(inflight)
        self._by_id[job.job_id] = inflight
        self._unsettled.append(inflight)

    def _enqueue_copies(
        self,
        inflight: _InFlight,
        runs: Sequence[Run],
        to_host: bool,
        stream: Stream,
        stable_source: bool,
    ) -> None:
        """Hand the job's runs to the copy path now, as vLLM's worker issues its copies at
        submission; a path that raises (a driver error, the test's fault hook after
        enqueueing half the runs) fails the job instead of the run."""
        gpu_flat, host_flat = self.gpu.flat, self.host.data
        dst, src = (host_flat, gpu_flat) if to_host else (gpu_flat, host_flat)
        path, page = self.copy_path, self.page_words
        fail = self.fault is not None and self.fault(inflight.job)
        try:
            part = runs[: len(runs) // 2] if fail else runs
            path.copy(dst, src, part, stream=stream, stable_source=stable_source, page_words=page)
            if fail:
                raise InjectedCopyError(f"injected failure in job {inflight.job.job_id}")
        except Exception as exc:  # a failed copy is a result, not a crash
            inflight.error = f"{type(exc).__name__}: {exc}"

    def _finish(self, inflight: _InFlight) -> TransferResult:
        job, rec = inflight.job, inflight.record
        rec.start_time = inflight.start.time()
        rec.end_time = inflight.end.time()
        rec.duration_s = inflight.end.seconds_since(inflight.start)
        rec.success = inflight.error is None
        rec.error = inflight.error
        inflight.finished = True
        self._by_id.pop(job.job_id, None)
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

    def _read_check(self, inflight: _InFlight, *, wait: bool) -> bool:
        """Account a load's byte check once its ``done`` event completed (``wait``: block
        on it) and give its staging slice back; True once read (or nothing to read)."""
        check = inflight.check
        if check is None or check.lease.released:
            return True
        if wait:
            inflight.done.synchronize()
        elif not inflight.done.query():
            return False
        if inflight.error is None:
            counts = check.out.numpy()
            bad = int((counts > 0).sum())
            integ = self.integrity
            integ.checked_blocks += int(counts.size)
            integ.unchecked_blocks += check.unchecked
            integ.mismatched_blocks += bad
            integ.mismatched_bytes += int(counts.sum())
            inflight.record.mismatched_blocks = bad
        check.lease.release()
        return True

    def _settle(self, block: bool = False) -> None:
        """Account the checks whose ``done`` event completed, and free the memory of jobs
        that are done and whose result was handed out (it stays busy until then)."""
        left = []
        for inflight in self._unsettled:
            if block:
                inflight.done.synchronize()
            read = self._read_check(inflight, wait=False)
            if not (read and inflight.finished and inflight.done.query()):
                left.append(inflight)
                continue
            self._release(inflight)
        self._unsettled = left

    def poll(self, now: float) -> list[TransferResult]:
        out, self._ready = self._ready, []
        for direction in DIRECTIONS:
            q = self._queues[direction]
            while q and q[0].end.query():
                out.append(self._finish(q.popleft()))
        self._settle()
        return out

    def wait(self, job_ids: Sequence[int], now: float) -> tuple[float, list[TransferResult]]:
        """Block on the jobs (copies and checks); like the simulated backend, the results
        are returned here *and* still reported once by the next ``poll``."""
        wanted = set(job_ids)
        for jid in wanted:
            inflight = self._by_id.get(jid)
            if inflight is not None:
                inflight.done.synchronize()
        for direction in DIRECTIONS:
            q = self._queues[direction]
            while q and q[0].end.query():
                self._ready.append(self._finish(q.popleft()))
        self._settle()
        return self.device.clock(), [r for r in self._ready if r.job_id in wanted]

    def next_completion_time(self) -> float | None:
        return None

    def host_free_time(self) -> float:
        return 0.0  # submit's host time is real: spent before it returns

    # ------------------------------------------------------------------ helpers

    @property
    def in_flight(self) -> int:
        return len(self._by_id)

    def drain(self) -> list[TransferResult]:
        """Wait for every job and check; returns the results not yet reported."""
        self.wait(list(self._by_id), self.device.clock())
        self._settle(block=True)
        out, self._ready = self._ready, []
        return out
