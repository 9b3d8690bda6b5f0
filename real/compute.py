"""The emulated forward pass of a real run: the modelled time, and on an asynchronous
device (CUDA, the threaded or deferred CPU device) a sleep on the compute stream for that
long.

The sleep matters for ordering, not for the engine's clock (the engine waits for the
modelled duration itself): stores and loads wait for the compute stream, so a load
submitted after a forward's launch starts when that forward ends, as in vLLM. The compute
stream never waits for loads: the engine schedules a request only after ``poll`` has
seen its load's end event, which is vLLM's own guarantee. On CPU the sleep ends at a
clock deadline, so the pattern fills queued before it are absorbed into the forward
instead of pushing every later forward back.
"""

from __future__ import annotations

from collections.abc import Callable

from kvsim.engine.step_batch import StepBatch
from real.device import Clock, Device


class EmulatedCompute:
    """``inner(batch) * scale`` seconds; enqueued on ``device``'s compute stream when the
    device runs asynchronously and ``enqueue`` is set."""

    def __init__(
        self,
        inner: Callable[[StepBatch], float],
        device: Device,
        scale: float = 1.0,
        *,
        enqueue: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.inner = inner
        self.device = device
        self.scale = scale
        self.enqueue = enqueue
        self.clock = clock

    def __call__(self, batch: StepBatch) -> float:
        dur = self.inner(batch) * self.scale
        device = self.device
        if self.enqueue and dur > 0 and device.asynchronous:
            clock = self.clock or device.clock
            device.sleep(device.compute_stream, dur, until=clock() + dur)
        return dur
