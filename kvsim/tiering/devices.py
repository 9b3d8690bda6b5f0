"""What a secondary tier's storage costs in time: device presets and the I/O queue model.

A tier's jobs (a promotion reads its chunks, a cascade writes them) are served the way
vLLM 0.33's ``fs`` tier serves them (``DualQueueThreadPool``): a job's chunks, one
operation each, are split evenly into ``min(chunks, pool)`` batches (``pool``: the read
threads for a load, the write threads for a store) and queued, loads on the load queue,
stores on the store queue; read threads take from the load queue first and fall back to
the store queue, write threads the reverse; a thread runs its batch's operations one after
the other. An operation costs its fixed latency (``*_latency_s``: open, request, rename),
then moves its bytes; the operations moving bytes in one direction share that direction's
device bandwidth equally, each capped by what one thread's stream gets
(``stream_*_bytes_per_s``). Reads and writes have separate bandwidths (an assumption: a
device's read and write figures are measured apart). A job finishes when its last
operation does. Existence checks (``fs``, ``obj``) are answered ``lookup_latency_s`` after
their batch is sent.

Presets (``nvme-gen4``, ``nvme-gen5``, ``shared-fs``, ``object-store``, ``instant``) are
``kvsim/data/tier_devices.json``, each figure with its source; a JSON file of the same
fields makes a custom device (described once by :class:`kvsim.tiering.device_file.DeviceFile`,
``kvsim schema tier-device``). The model is deterministic: equal-time events are taken in a
fixed order.
"""

from __future__ import annotations

import copy
import heapq
import json
import math
import os
from collections import deque
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.io import read_json
from kvsim.options.schema import load
from kvsim.options.tiers import TierSpec
from kvsim.tiering.device_file import DeviceFile

#: the default device of each tier type
DEFAULT_DEVICES = {"fs": "nvme-gen4", "obj": "object-store", "example": "instant"}
_RATES = (
    "read_bytes_per_s",
    "write_bytes_per_s",
    "stream_read_bytes_per_s",
    "stream_write_bytes_per_s",
)
_LATENCIES = ("read_latency_s", "write_latency_s", "lookup_latency_s")
_THREADS = ("n_read_threads", "n_write_threads")


@dataclass(frozen=True)
class DeviceSpec:
    """One storage device as a tier sees it (rates in bytes/s, ``inf``: unlimited)."""

    name: str
    read_bytes_per_s: float
    write_bytes_per_s: float
    stream_read_bytes_per_s: float
    stream_write_bytes_per_s: float
    read_latency_s: float
    write_latency_s: float
    lookup_latency_s: float
    n_read_threads: int
    n_write_threads: int
    description: str = ""
    source: dict[str, str] = field(default_factory=dict, compare=False)

    def with_threads(self, n_read: int | None, n_write: int | None) -> DeviceSpec:
        """The device under a tier's own thread counts (vLLM's keys win over the preset)."""
        return replace(
            self,
            n_read_threads=n_read or self.n_read_threads,
            n_write_threads=n_write or self.n_write_threads,
        )

    def op_rate(self, read: bool, sharing: int = 1) -> float:
        """Bytes/s of one operation while ``sharing`` operations move bytes in its direction."""
        if read:
            return min(self.stream_read_bytes_per_s, self.read_bytes_per_s / sharing)
        return min(self.stream_write_bytes_per_s, self.write_bytes_per_s / sharing)

    def op_time(self, read: bool, nbytes: int, sharing: int = 1) -> float:
        """Seconds of one operation of ``nbytes`` while ``sharing`` run in its direction."""
        latency = self.read_latency_s if read else self.write_latency_s
        return latency + _over(nbytes, self.op_rate(read, sharing))

    def job_time(self, read: bool, chunks: int, chunk_bytes: int) -> float:
        """A job's time on an idle device: its batches run side by side, then the longer
        batches' last operations (the queue model's answer, in closed form)."""
        if chunks <= 0:
            return 0.0
        pool = self.n_read_threads if read else self.n_write_threads
        width = min(chunks, pool)
        rounds, extra = divmod(chunks, width)
        total = rounds * self.op_time(read, chunk_bytes, width)
        if extra:
            total += self.op_time(read, chunk_bytes, extra)
        return total

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "description": self.description}
        for key in (*_RATES, *_LATENCIES, *_THREADS):
            value = getattr(self, key)
            out[key] = None if value == math.inf else value
        out["source"] = dict(self.source)
        return out


def _over(nbytes: float, rate: float) -> float:
    return 0.0 if rate == math.inf or nbytes <= 0 else nbytes / rate


@cache
def device_presets() -> dict[str, dict[str, Any]]:
    """The shipped presets, by name (their raw JSON objects)."""
    text = resources.files("kvsim").joinpath("data").joinpath("tier_devices.json").read_text()
    data = json.loads(text)
    return {k: v for k, v in data.items() if not k.startswith("_")}


def load_device(name_or_path: str, where: str = "device") -> DeviceSpec:
    """A preset by name, or a JSON file of the preset fields (a missing field: an error)."""
    presets = device_presets()
    if name_or_path in presets:
        return _device(name_or_path, presets[name_or_path], where)
    if os.path.exists(name_or_path) or name_or_path.endswith(".json"):
        return _device(name_or_path, read_json(name_or_path), f"{where} {name_or_path}")
    raise InputError(
        f"{where}: unknown device {name_or_path!r}; presets: {', '.join(presets)} "
        "(or a device JSON file)"
    )


def tier_device(spec: TierSpec, where: str) -> DeviceSpec:
    """A tier's device: its ``kvsim_device`` (or its type's default) under the tier's own
    I/O thread counts (vLLM's ``n_read_threads`` / ``n_write_threads`` / ``io_threads``)."""
    name = spec.device or DEFAULT_DEVICES.get(spec.type, "instant")
    device = load_device(name, f"{where}: kvsim_device")
    return device.with_threads(spec.n_read_threads, spec.n_write_threads)


def _device(name: str, data: Any, where: str) -> DeviceSpec:
    """A device from its JSON object, checked by :class:`DeviceFile`."""
    f = load(DeviceFile, data, source=where)
    rates = {k: math.inf if getattr(f, k) is None else getattr(f, k) for k in _RATES}
    return DeviceSpec(
        name=f.name or name,
        description=f.description,
        source=dict(f.source),
        read_latency_s=f.read_latency_s,
        write_latency_s=f.write_latency_s,
        lookup_latency_s=f.lookup_latency_s,
        n_read_threads=f.n_read_threads,
        n_write_threads=f.n_write_threads,
        **rates,
    )


# --- the queue model ---


@dataclass(slots=True)
class _Job:
    job_id: int
    read: bool
    op_bytes: int
    ops_left: int


@dataclass(slots=True)
class _Thread:
    index: int
    read_first: bool
    job: _Job | None = None
    ops_left: int = 0  # of its current batch


class _Channel:
    """One direction's bandwidth, shared equally by the operations moving bytes in it.

    Every operation in the channel moves at the same rate, so one number (``progress``:
    bytes each has moved since the channel opened) dates them all: an operation that
    entered at progress p with b bytes ends when progress reaches p + b."""

    __slots__ = ("bandwidth", "ops", "progress", "seq", "stream")

    def __init__(self, bandwidth: float, stream: float) -> None:
        self.bandwidth, self.stream = bandwidth, stream
        self.progress = 0.0
        self.ops: list[tuple[float, int, int]] = []  # (progress at the end, seq, thread)
        self.seq = 0

    def rate(self) -> float:
        n = len(self.ops)
        return min(self.stream, self.bandwidth / n) if n else 0.0

    def add(self, nbytes: int, thread: int) -> None:
        self.seq += 1
        heapq.heappush(self.ops, (self.progress + nbytes, self.seq, thread))

    def next_end(self, now: float) -> float | None:
        if not self.ops:
            return None
        return now + _over(self.ops[0][0] - self.progress, self.rate())

    def move(self, dt: float) -> None:
        if self.ops and dt > 0:
            self.progress += self.rate() * dt


class TierDevice:
    """A tier's I/O threads and device on a clock passed in: ``submit`` jobs, ``advance``
    to a time and collect ``(finish time, job id)`` in the order they finished."""

    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self.now = 0.0
        n_read, n_write = spec.n_read_threads, spec.n_write_threads
        self._threads = [_Thread(i, True) for i in range(n_read)] + [
            _Thread(n_read + i, False) for i in range(n_write)
        ]
        self._load_q: deque[tuple[_Job, int]] = deque()
        self._store_q: deque[tuple[_Job, int]] = deque()
        self._read = _Channel(spec.read_bytes_per_s, spec.stream_read_bytes_per_s)
        self._write = _Channel(spec.write_bytes_per_s, spec.stream_write_bytes_per_s)
        self._latency: list[tuple[float, int, int]] = []  # (end, seq, thread)
        self._seq = 0
        self._jobs = 0
        self._queued_load_ops = 0
        self.finished: list[tuple[float, int]] = []

    @property
    def busy(self) -> bool:
        return self._jobs > 0

    @property
    def jobs_in_flight(self) -> int:
        """Jobs submitted and not finished (queued for a thread or moving)."""
        return self._jobs

    def submit(self, job_id: int, read: bool, chunks: int, chunk_bytes: int, now: float) -> None:
        """Queue a job of ``chunks`` operations of ``chunk_bytes`` at ``now`` (vLLM's
        batching: split evenly over the reading or the writing pool)."""
        self.advance(now)
        if chunks <= 0:
            self.finished.append((self.now, job_id))
            return
        job = _Job(job_id, read, chunk_bytes, chunks)
        self._jobs += 1
        pool = self.spec.n_read_threads if read else self.spec.n_write_threads
        q, r = divmod(chunks, pool)
        queue = self._load_q if read else self._store_q
        for i in range(min(chunks, pool)):
            queue.append((job, q + 1 if i < r else q))
        if read:
            self._queued_load_ops += chunks
        self._dispatch()

    def advance(self, until: float) -> None:
        """Run every event up to ``until`` (finished jobs go to :attr:`finished`)."""
        while True:
            t, kind = self._next_event()
            if t is None or t > until:
                self._move(until)
                return
            self._move(t)
            if kind == 0:
                _, _, index = heapq.heappop(self._latency)
                self._enter_channel(self._threads[index])
            else:
                channel = self._read if kind == 1 else self._write
                _, _, index = heapq.heappop(channel.ops)
                self._op_done(self._threads[index])
            self._dispatch()

    def next_finish_time(self) -> float | None:
        """When the next job finishes if nothing more is submitted (None: no job)."""
        if self.finished:
            return self.finished[0][0]
        if not self._jobs:
            return None
        probe = copy.deepcopy(self)
        while not probe.finished:
            t, _ = probe._next_event()
            if t is None:
                return None
            probe.advance(t)
        return probe.finished[0][0]

    def take_finished(self) -> list[tuple[float, int]]:
        out, self.finished = self.finished, []
        return out

    def read_backlog_s(self) -> float:
        """Seconds the load operations queued (not started) hold the read bandwidth."""
        if not self._queued_load_ops:
            return 0.0
        queued = sum(job.op_bytes * n for job, n in self._load_q)
        return _over(queued, self.spec.read_bytes_per_s)

    # --- events ---

    def _next_event(self) -> tuple[float | None, int]:
        best: float | None = None
        kind = 0
        if self._latency:
            best = self._latency[0][0]
        for k, channel in ((1, self._read), (2, self._write)):
            end = channel.next_end(self.now)
            if end is not None and (best is None or end < best):
                best, kind = end, k
        return best, kind

    def _move(self, t: float) -> None:
        if t > self.now:
            dt = t - self.now
            self._read.move(dt)
            self._write.move(dt)
            self.now = t

    def _dispatch(self) -> None:
        """Idle threads take batches, in thread order: first each from its own queue (read
        threads the load queue, write threads the store queue), then from the other; again
        while a zero-time batch frees a thread."""
        taken = True
        while taken and (self._load_q or self._store_q):
            taken = False
            for own in (True, False):
                for thread in self._threads:
                    if thread.job is not None:
                        continue
                    queue = self._load_q if thread.read_first == own else self._store_q
                    if queue:
                        self._take(thread, queue)
                        taken = True

    def _take(self, thread: _Thread, queue: deque[tuple[_Job, int]]) -> None:
        job, n = queue.popleft()
        if job.read:
            self._queued_load_ops -= n
        thread.job, thread.ops_left = job, n
        self._start_op(thread)

    def _start_op(self, thread: _Thread) -> None:
        job = thread.job
        assert job is not None
        latency = self.spec.read_latency_s if job.read else self.spec.write_latency_s
        if latency > 0:
            self._seq += 1
            heapq.heappush(self._latency, (self.now + latency, self._seq, thread.index))
        else:
            self._enter_channel(thread)

    def _enter_channel(self, thread: _Thread) -> None:
        job = thread.job
        assert job is not None
        channel = self._read if job.read else self._write
        if (channel.stream == math.inf and channel.bandwidth == math.inf) or job.op_bytes <= 0:
            self._op_done(thread)
        else:
            channel.add(job.op_bytes, thread.index)

    def _op_done(self, thread: _Thread) -> None:
        job = thread.job
        assert job is not None
        job.ops_left -= 1
        if job.ops_left == 0:
            self._jobs -= 1
            self.finished.append((self.now, job.job_id))
        thread.ops_left -= 1
        if thread.ops_left:
            self._start_op(thread)
        else:
            thread.job = None
