"""Device layer: CUDA streams and events, or CPU tensors that behave like a GPU.

The transfer backend only ever calls ``stream.run(fn)``, ``stream.wait_event(ev)``,
``stream.wait_stream(other)``, ``event.record(stream)``, ``event.query()``,
``event.synchronize()``, ``event.time()`` and ``end.seconds_since(start)``. On CUDA these
are torch streams and timing events. On CPU a stream is a FIFO of closures and an event is
a marker in it; three modes:

* ``eager``: every operation runs when it is enqueued (everything completes in order);
* ``deferred`` (tests): operations wait in their stream until something needs them
  (``event.synchronize()``, a ``wait_event`` that is itself run, ``run_pending()``), and
  every ``event.query()`` lets a few queued operations of randomly chosen streams run
  (seeded). Work therefore completes *later* than submitted and *out of submission order
  across streams*, as on a GPU, so a missing cross-stream dependency corrupts bytes or
  fails a test instead of passing by luck;
* ``threaded`` (CPU validation and calibration): one worker thread per stream runs its
  FIFO asynchronously, so copies overlap the engine as DMA overlaps the host on a GPU
  (torch releases the GIL inside copies).

Like torch's CUDA stream pool, a CPU device hands out at most 32 distinct side streams and
then repeats them; :meth:`Device.stream` caches streams by name and never returns one this
device already uses for another name. Event times are on the device's clock
(``time.perf_counter`` unless injected); CUDA event times are mapped onto it through a
reference event. That mapping is a float32 count of milliseconds since the reference
(``cudaEventElapsedTime``), whose quantum grows with the reference's age (about 8 us two
minutes on), so a duration is never a difference of two such times: ``seconds_since``
measures it from its own start event (as vLLM times its transfers), and ``reanchor`` starts a
fresh reference where a run or a measurement begins.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import cast

import torch

from real.device_types import CopyPath, Event, Stream
from real.sleep_clock import SleepRate

Clock = Callable[[], float]

MODES = ("eager", "deferred", "threaded")
CPU_SWITCH_INTERVAL_S = 0.0005
STREAM_POOL_SIZE = 32  # torch's per-priority CUDA stream pool; it repeats after that


def cuda_available() -> bool:
    """Whether a CUDA device can be used (not ``torch.accelerator``: it lies without a driver)."""
    return torch.cuda.is_available()


# --------------------------------------------------------------------------- CPU emulation


class CpuEvent:
    """A marker in a :class:`CpuStream`; complete once the stream has run up to it."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._stream: CpuStream | None = None
        self._done = False
        self._time: float | None = None
        self._flag = threading.Event()

    def _fire(self) -> None:
        self._time = self._device.clock()
        self._done = True
        self._flag.set()

    def record(self, stream: Stream) -> None:
        cpu = _cpu_stream(stream)
        self._done = False
        self._time = None
        self._flag.clear()
        self._stream = cpu
        cpu._enqueue(self._fire)

    def query(self) -> bool:
        if not self._done and self._device.mode == "deferred":
            self._device._progress()
        return self._done

    def synchronize(self) -> None:
        if self._done:
            return
        if self._stream is None:
            raise RuntimeError("synchronize() on an event that was never recorded")
        if self._device.mode == "threaded":
            self._flag.wait()
            self._device._raise_worker_error()
        else:
            self._stream._run_until(self)

    def time(self) -> float:
        """Clock time at which the event completed (it must be complete)."""
        if self._time is None:
            raise RuntimeError("event time read before the event completed")
        return self._time

    def seconds_since(self, start: Event) -> float:
        """Seconds from ``start`` to this event (both complete; the clock is float64)."""
        return self.time() - cast(CpuEvent, start).time()


class CpuStream:
    """A FIFO of operations: run at once (eager), on demand (deferred) or by a thread."""

    def __init__(self, device: Device, name: str = "") -> None:
        self._device = device
        self.name = name
        self._ops: deque[Callable[[], None]] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def _enqueue(self, op: Callable[[], None]) -> None:
        mode = self._device.mode
        if mode == "eager" and not self._ops:
            op()
        elif mode == "threaded":
            with self._cv:
                self._ops.append(op)
                self._cv.notify_all()
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._worker, name=f"kvsim-stream-{self.name}", daemon=True
                    )
                    self._thread.start()
        else:
            self._ops.append(op)

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._ops:
                    self._cv.wait()
                op = self._ops[0]  # stays queued while it runs, so ``pending`` counts it
            try:
                op()
            except BaseException as exc:  # reported by the next synchronize()
                self._device._worker_errors.append(exc)
            with self._cv:
                self._ops.popleft()
                self._cv.notify_all()

    def _run_one(self) -> bool:
        if not self._ops:
            return False
        op = self._ops.popleft()
        op()
        return True

    def _run_until(self, event: CpuEvent) -> None:
        while not event._done:
            if not self._run_one():
                raise RuntimeError(f"stream {self.name!r} drained before its event fired")

    def run(self, fn: Callable[[], None]) -> None:
        """Enqueue ``fn`` (tensor work) on this stream."""
        self._enqueue(fn)

    def wait_event(self, event: Event) -> None:
        """Later work on this stream starts only after ``event`` completes."""
        cpu_event = cast(CpuEvent, event)
        if cpu_event._done:
            return
        if self._device.mode == "threaded":
            flag = cpu_event._flag

            def wait() -> None:
                flag.wait()

            self._enqueue(wait)
        else:
            self._enqueue(cpu_event.synchronize)

    def wait_stream(self, other: Stream) -> None:
        if other is self:
            return
        ev = CpuEvent(self._device)
        ev.record(other)
        self.wait_event(ev)

    def synchronize(self) -> None:
        if self._device.mode == "threaded":
            with self._cv:
                while self._ops:
                    self._cv.wait()
            self._device._raise_worker_error()
            return
        while self._run_one():
            pass

    @property
    def pending(self) -> int:
        return len(self._ops)


# --------------------------------------------------------------------------- CUDA wrappers


class CudaEvent:
    """A timing CUDA event whose completion time is mapped onto the device clock."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._ev = torch.cuda.Event(enable_timing=True)

    def record(self, stream: Stream) -> None:
        self._ev.record(as_cuda_stream(stream).raw)

    def query(self) -> bool:
        return self._ev.query()

    def synchronize(self) -> None:
        self._ev.synchronize()

    def time(self) -> float:
        """Device-clock time of the event: the reference's clock time plus the float32
        milliseconds since the reference event (coarser as the reference ages)."""
        ref_event, ref_time = self._device._reference()
        return ref_time + ref_event.elapsed_time(self._ev) / 1e3

    def seconds_since(self, start: Event) -> float:
        """Seconds from ``start`` to this event, measured between the two events
        (``cudaEventElapsedTime``: about half a microsecond of resolution at any age)."""
        return _cuda_event(start)._ev.elapsed_time(self._ev) / 1e3


class CudaStream:
    """A torch CUDA stream behind the :class:`Stream` interface (``raw`` is the torch one)."""

    def __init__(self, device: Device, raw: torch.cuda.Stream, name: str = "") -> None:
        self._device = device
        self.raw = raw
        self.name = name

    def run(self, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(self.raw):
            fn()

    def wait_event(self, event: Event) -> None:
        self.raw.wait_event(_cuda_event(event)._ev)

    def wait_stream(self, other: Stream) -> None:
        if other is not self:
            self.raw.wait_stream(as_cuda_stream(other).raw)

    def synchronize(self) -> None:
        self.raw.synchronize()

    @property
    def pending(self) -> int:
        return 0 if self.raw.query() else 1


def _cpu_stream(stream: Stream) -> CpuStream:
    # a CPU device only ever hands out CpuStreams (no runtime check: behaviour as before)
    return cast(CpuStream, stream)


def as_cuda_stream(stream: Stream) -> CudaStream:
    """``stream`` as the :class:`CudaStream` a CUDA device hands out (a static cast only)."""
    return cast(CudaStream, stream)


def _cuda_event(event: Event) -> CudaEvent:
    # a CUDA device only ever hands out CudaEvents
    return cast(CudaEvent, event)


# --------------------------------------------------------------------------- device


class Device:
    """``kind`` is ``"cuda"`` or ``"cpu"``; ``Device.auto()`` picks CUDA when available.

    ``mode`` (CPU only) is ``eager``, ``deferred`` or ``threaded`` (see the module
    docstring); ``eager=False`` is the older spelling of ``mode="deferred"``. ``seed``
    drives the deferred device's choice of which stream runs next.
    """

    def __init__(
        self,
        kind: str = "cpu",
        *,
        eager: bool = True,
        mode: str | None = None,
        clock: Clock | None = None,
        index: int = 0,
        seed: int = 0,
        progress_ops: int = 3,
    ) -> None:
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"device kind must be 'cpu' or 'cuda', got {kind!r}")
        if kind == "cuda" and not cuda_available():
            raise RuntimeError("CUDA requested but torch.cuda.is_available() is False")
        mode = mode or ("eager" if eager else "deferred")
        if mode not in MODES:
            raise ValueError(f"device mode must be one of {MODES}, got {mode!r}")
        self.kind = kind
        self.mode = "cuda" if kind == "cuda" else mode
        self.clock: Clock = clock or time.perf_counter
        self.torch_device = torch.device("cuda", index) if kind == "cuda" else torch.device("cpu")
        self._rng = random.Random(seed)
        self._progress_ops = progress_ops
        self._progressing = False
        self._worker_errors: list[BaseException] = []
        self._pool: list[Stream] = []  # the emulated CPU stream pool
        self._pool_next = 0
        self._named: dict[str, Stream] = {}
        self._streams: list[Stream] = []
        self._ref: tuple[torch.cuda.Event, float] | None = None
        self._sleep_rate: SleepRate | None = None
        self._copy_path: CopyPath | None = None
        self.compute_stream: Stream
        if kind == "cuda":
            self.compute_stream = CudaStream(
                self, torch.cuda.current_stream(self.torch_device), "compute"
            )
        else:
            self.compute_stream = CpuStream(self, "compute")
        self._streams.append(self.compute_stream)
        if kind == "cuda":
            self._reference()  # event times are measured from here onto the clock

    @classmethod
    def auto(cls, *, mode: str = "eager", clock: Clock | None = None, index: int = 0) -> Device:
        """CUDA when available, else a CPU device in ``mode``."""
        if cuda_available():
            return cls("cuda", clock=clock, index=index)
        return cls("cpu", mode=mode, clock=clock)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def asynchronous(self) -> bool:
        """Whether enqueued work completes after the call that enqueued it (all but eager)."""
        return self.mode != "eager"

    # --- streams and events

    def stream(self, name: str) -> Stream:
        """The side stream called ``name`` (created on first use, distinct from the others)."""
        s = self._named.get(name)
        if s is None:
            s = self._distinct_stream(name)
            self._named[name] = s
            self._streams.append(s)
        return s

    def _distinct_stream(self, name: str) -> Stream:
        held = {self._identity(s) for s in self._streams}
        for _ in range(STREAM_POOL_SIZE + 1):
            s = self._draw_stream(name)
            if self._identity(s) not in held:
                s.name = name
                return s
        raise RuntimeError(f"no free stream left in the pool of {STREAM_POOL_SIZE}")

    def _identity(self, s: Stream) -> int:
        if self.is_cuda:
            return int(as_cuda_stream(s).raw.cuda_stream)  # the handle identifies the stream
        return id(s)

    def _draw_stream(self, name: str) -> Stream:
        """A stream from the pool, which repeats after ``STREAM_POOL_SIZE`` draws."""
        if self.is_cuda:
            raw = torch.cuda.Stream(self.torch_device)
            for s in self._streams:
                if as_cuda_stream(s).raw.cuda_stream == raw.cuda_stream:
                    return s
            return CudaStream(self, raw, name)
        i = self._pool_next % STREAM_POOL_SIZE
        self._pool_next += 1
        if i == len(self._pool):
            self._pool.append(CpuStream(self, name))
        return self._pool[i]

    def new_stream(self, name: str = "") -> Stream:
        """A stream drawn from the pool, like ``torch.cuda.Stream()`` (may repeat one)."""
        return self._draw_stream(name)

    def new_event(self) -> Event:
        return CudaEvent(self) if self.is_cuda else CpuEvent(self)

    @contextlib.contextmanager
    def on_compute_stream(self) -> Iterator[None]:
        """Tensor work issued inside goes to the compute stream (CUDA); on CPU it runs at
        once, as every CPU tensor operation does. For buffers built at construction that
        every stream later reads: each job's stream waits for the compute stream."""
        if self.is_cuda:
            with torch.cuda.stream(as_cuda_stream(self.compute_stream).raw):
                yield
        else:
            yield

    def staging_allocator(self) -> Callable[[int], torch.Tensor]:
        """How host staging words are allocated: page-locked on CUDA (asynchronous copies),
        plain memory on the CPU stand-ins (:mod:`real.staging`)."""
        from real.staging import host_words, pinned_words

        return pinned_words if self.is_cuda else host_words

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.torch_device)

    def copy_path(self) -> CopyPath:
        """How this device copies runs of words (resolved once; see :mod:`real.copy_path`)."""
        if self._copy_path is None:
            from real.copy_path import default_copy_path

            self._copy_path = default_copy_path(self)
        return self._copy_path

    def set_copy_path(self, path: CopyPath) -> None:
        self._copy_path = path

    @property
    def pending(self) -> int:
        """Operations queued on the CPU streams (0 on CUDA: the driver does not say)."""
        if self.is_cuda:
            return 0
        return sum(_cpu_stream(s).pending for s in self._all_cpu_streams())

    def _all_cpu_streams(self) -> list[CpuStream]:
        seen: dict[int, CpuStream] = {}
        for s in [*self._streams, *self._pool]:
            seen[id(s)] = _cpu_stream(s)
        return list(seen.values())

    def run_pending(self) -> None:
        """Complete all queued work on every stream (CPU), or synchronize the device (CUDA)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)
            return
        streams = self._all_cpu_streams()
        if self.mode == "threaded":
            for s in streams:
                s.synchronize()
            self._raise_worker_error()
            return
        while True:
            live = [s for s in streams if s.pending]
            if not live:
                return
            self._rng.choice(live)._run_one()

    def _progress(self) -> None:
        """Deferred mode: let a few queued operations of random streams run."""
        if self._progressing:
            return
        self._progressing = True
        try:
            for _ in range(self._rng.randint(0, self._progress_ops)):
                live = [s for s in self._all_cpu_streams() if s.pending]
                if not live:
                    break
                self._rng.choice(live)._run_one()
        finally:
            self._progressing = False

    def _raise_worker_error(self) -> None:
        if self._worker_errors:
            exc = self._worker_errors.pop(0)
            raise RuntimeError(f"an operation on a CPU stream failed: {exc!r}") from exc

    # --- emulated compute

    def sleep(self, stream: Stream, seconds: float, *, until: float | None = None) -> None:
        """Occupy ``stream`` for ``seconds``: a GPU spin kernel, or a wait on CPU (until
        clock time ``until`` when given, so work queued before it is absorbed)."""
        if seconds <= 0:
            return
        if self.is_cuda:
            rate = self._gpu_sleep_rate()
            raw = as_cuda_stream(stream).raw
            rate.sleep(raw, seconds)
            return
        clock = self.clock

        def wait() -> None:
            _sleep_until(until if until is not None else clock() + seconds, clock)

        stream.run(wait)

    # --- CUDA helpers

    def set_clock(self, clock: Clock) -> None:
        """Switch to another clock (a run's monotonic clock); re-anchors CUDA event times."""
        self.clock = clock
        self.reanchor()

    def reanchor(self) -> None:
        """A fresh reference for absolute CUDA event times (where a run or a measurement
        starts), so their float32 quantum stays that of a young reference. Times of events
        read before and after are on the same clock, up to the anchoring error."""
        self._ref = None
        if self.is_cuda:
            self._reference()

    def _reference(self) -> tuple[torch.cuda.Event, float]:
        if self._ref is None:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(as_cuda_stream(self.compute_stream).raw)
            ev.synchronize()
            self._ref = (ev, self.clock())
        return self._ref

    def _gpu_sleep_rate(self) -> SleepRate:
        if self._sleep_rate is None:
            from real.sleep_clock import cuda_sleep_rate

            self._sleep_rate = cuda_sleep_rate(as_cuda_stream(self.compute_stream).raw)
        return self._sleep_rate


def cpu_stand_in(mode: str = "threaded", *, clock: Clock | None = None) -> Device:
    """The CPU device the command line runs on without CUDA: threaded streams; one
    intra-op thread per torch call, so each stream thread is one copy engine instead of
    every copy fanning out over all cores while the others run; and a short GIL switch
    interval, so a stream thread issues its next copy soon after the last one returns
    instead of waiting up to 5 ms for the engine's thread (a DMA engine never waits for
    the host). Both are process-wide; calibration and validation get the same ones."""
    torch.set_num_threads(1)
    sys.setswitchinterval(CPU_SWITCH_INTERVAL_S)
    return Device("cpu", mode=mode, clock=clock)


def _sleep_until(end: float, clock: Clock) -> None:
    """Sleep until clock time ``end``. Never spin: a spinning Python thread holds the GIL
    and would slow the stream threads' copies, which need it between runs."""
    while (left := end - clock()) > 0:
        time.sleep(left)
