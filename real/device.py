"""Device layer: CUDA streams and events, or CPU tensors with the same semantics.

The transfer backend only ever calls ``stream.run(fn)``, ``stream.wait_event(ev)``,
``stream.wait_stream(other)``, ``event.record(stream)``, ``event.query()``,
``event.synchronize()`` and ``event.time()``. On CUDA these are torch streams and timing
events. On CPU a stream is a FIFO of closures and an event is a marker in it:

* ``eager=True`` (the default): every operation runs when it is enqueued, so copies
  complete in order and an event is complete as soon as it is recorded;
* ``eager=False``: operations wait until something needs them (``event.synchronize()``,
  a ``wait_event`` that is itself run, or ``Device.run_pending()``), so tests can hold a
  copy "in flight" and check that nothing reads or reuses its memory too early.

Event times are on the device's clock (``time.perf_counter`` unless injected); CUDA
event times are mapped onto it through a reference event.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

import torch

Clock = Callable[[], float]


class Event(Protocol):
    """What the backend calls on an event (:class:`CpuEvent` or :class:`CudaEvent`)."""

    def record(self, stream: Stream) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def time(self) -> float: ...


class Stream(Protocol):
    """What the backend calls on a stream (:class:`CpuStream` or :class:`CudaStream`).

    A device hands out streams and events of its own kind only; the concrete classes
    narrow their arguments to that kind (see :func:`_cpu_stream`, :func:`as_cuda_stream`).
    """

    name: str

    def run(self, fn: Callable[[], None]) -> None: ...

    def wait_event(self, event: Event) -> None: ...

    def wait_stream(self, other: Stream) -> None: ...

    def synchronize(self) -> None: ...

    @property
    def pending(self) -> int: ...


def cuda_available() -> bool:
    """Whether a CUDA device can be used (not ``torch.accelerator``: it lies without a driver)."""
    return torch.cuda.is_available()


# --------------------------------------------------------------------------- CPU emulation


class CpuEvent:
    """A marker in a :class:`CpuStream`; complete once the stream has run up to it."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._stream: CpuStream | None = None
        self._done = False
        self._time: float | None = None

    def _fire(self) -> None:
        self._done = True
        self._time = self._clock()

    def record(self, stream: Stream) -> None:
        cpu = _cpu_stream(stream)
        self._done = False
        self._time = None
        self._stream = cpu
        cpu._enqueue(self._fire)

    def query(self) -> bool:
        return self._done

    def synchronize(self) -> None:
        if not self._done:
            if self._stream is None:
                raise RuntimeError("synchronize() on an event that was never recorded")
            self._stream._run_until(self)

    def time(self) -> float:
        """Clock time at which the event completed (it must be complete)."""
        if self._time is None:
            raise RuntimeError("event time read before the event completed")
        return self._time


class CpuStream:
    """A FIFO of operations; run at once (eager) or when something waits for them."""

    def __init__(self, device: Device, name: str = "") -> None:
        self._device = device
        self.name = name
        self._ops: deque[Callable[[], None]] = deque()

    def _enqueue(self, op: Callable[[], None]) -> None:
        if self._device.eager and not self._ops:
            op()
        else:
            self._ops.append(op)

    def _run_one(self) -> bool:
        if not self._ops:
            return False
        op = self._ops.popleft()
        op()
        return True

    def _run_until(self, event: CpuEvent) -> None:
        while not event.query():
            if not self._run_one():
                raise RuntimeError(f"stream {self.name!r} drained before its event fired")

    def run(self, fn: Callable[[], None]) -> None:
        """Enqueue ``fn`` (tensor work) on this stream."""
        self._enqueue(fn)

    def wait_event(self, event: Event) -> None:
        """Later work on this stream starts only after ``event`` completes."""
        if event.query():
            return
        self._enqueue(event.synchronize)

    def wait_stream(self, other: Stream) -> None:
        if other is self:
            return
        ev = CpuEvent(self._device.clock)
        ev.record(other)
        self.wait_event(ev)

    def synchronize(self) -> None:
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
        ref_event, ref_time = self._device._reference()
        return ref_time + ref_event.elapsed_time(self._ev) / 1e3


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
    """``kind`` is ``"cuda"`` or ``"cpu"``; ``Device.auto()`` picks CUDA when available."""

    def __init__(
        self, kind: str = "cpu", *, eager: bool = True, clock: Clock | None = None, index: int = 0
    ) -> None:
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"device kind must be 'cpu' or 'cuda', got {kind!r}")
        if kind == "cuda" and not cuda_available():
            raise RuntimeError("CUDA requested but torch.cuda.is_available() is False")
        self.kind = kind
        self.eager = eager
        self.clock: Clock = clock or time.perf_counter
        self.torch_device = torch.device("cuda", index) if kind == "cuda" else torch.device("cpu")
        self._streams: list[Stream] = []
        self._ref: tuple[torch.cuda.Event, float] | None = None
        self._cycles_per_s: float | None = None
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
    def auto(cls, *, eager: bool = True, clock: Clock | None = None, index: int = 0) -> Device:
        return cls("cuda" if cuda_available() else "cpu", eager=eager, clock=clock, index=index)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def new_stream(self, name: str = "") -> Stream:
        s: Stream
        if self.is_cuda:
            s = CudaStream(self, torch.cuda.Stream(self.torch_device), name)
        else:
            s = CpuStream(self, name)
        self._streams.append(s)
        return s

    def new_event(self) -> Event:
        return CudaEvent(self) if self.is_cuda else CpuEvent(self.clock)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.torch_device)

    def run_pending(self) -> None:
        """Complete all queued work on every stream (CPU), or synchronize the device (CUDA)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)
            return
        progressed = True
        while progressed:
            progressed = False
            for s in self._streams:
                if s.pending:
                    _cpu_stream(s)._run_one()
                    progressed = True

    def sleep(self, stream: Stream, seconds: float) -> None:
        """Occupy ``stream`` for ``seconds``: a GPU spin kernel, or a wall-clock wait on CPU."""
        if seconds <= 0:
            return
        if self.is_cuda:
            cycles = int(seconds * self._gpu_cycles_per_s())
            stream.run(lambda: torch.cuda._sleep(cycles))
        else:
            stream.run(lambda: _precise_sleep(seconds, self.clock))

    # --- CUDA helpers

    def set_clock(self, clock: Clock) -> None:
        """Switch to another clock (a run's monotonic clock); re-anchors CUDA event times."""
        self.clock = clock
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

    def _gpu_cycles_per_s(self) -> float:
        if self._cycles_per_s is None:
            raw = as_cuda_stream(self.compute_stream).raw
            cycles = 20_000_000
            with torch.cuda.stream(raw):
                torch.cuda._sleep(1000)  # warm-up
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record(raw)
                torch.cuda._sleep(cycles)
                b.record(raw)
            b.synchronize()
            self._cycles_per_s = cycles / (a.elapsed_time(b) / 1e3)
        return self._cycles_per_s


def _precise_sleep(seconds: float, clock: Clock) -> None:
    """Sleep most of the way, then spin, so short compute steps keep their length."""
    end = clock() + seconds
    if seconds > 0.002:
        time.sleep(seconds - 0.001)
    while clock() < end:
        pass
