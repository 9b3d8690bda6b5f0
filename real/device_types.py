"""The real backend's interfaces, in a module below every implementation: a stream and an
event (:class:`Stream`, :class:`Event`; :mod:`real.device` implements them on CUDA and on
the CPU stand-ins), how a device copies runs of words (:class:`CopyPath`;
:mod:`real.copy_path`), and what the copy paths and the KV cache need of a device
(:class:`DeviceLike`; :class:`real.device.Device` is one). The modules that implement
them import this one, not each other, for their types.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, cast

import torch

__all__ = ["CopyPath", "DeviceLike", "Event", "Run", "Stream", "cuda_stream_handle"]

Run = tuple[int, int, int]  # (dst word, src word, words)


class Event(Protocol):
    """What the backend calls on an event (:class:`CpuEvent` or :class:`CudaEvent`)."""

    def record(self, stream: Stream) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def time(self) -> float: ...

    def seconds_since(self, start: Event) -> float: ...


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


class CopyPath(Protocol):
    """Enqueues copies of runs from ``src`` to ``dst`` on ``stream`` (called on the host)."""

    name: str

    def prepare(self, page_bytes: int, device: torch.device) -> None:
        """Get ready for jobs of ``page_bytes`` pages on ``device`` (compile what they run)."""
        ...

    def route(
        self, dst: torch.Tensor, src: torch.Tensor, runs: Sequence[Run], page_words: int | None
    ) -> str:
        """The name of the path that would copy these runs (a wrapper may choose per job)."""
        ...

    def copy(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        runs: Sequence[Run],
        *,
        stream: Stream,
        stable_source: bool,
        page_words: int | None = None,
    ) -> None: ...


class DeviceLike(Protocol):
    """What the copy paths and the KV cache read of a device (:class:`real.device.Device`)."""

    torch_device: torch.device

    @property
    def is_cuda(self) -> bool: ...

    def on_compute_stream(self) -> AbstractContextManager[None]:
        """Tensor work issued inside goes to the device's compute stream."""
        ...

    def run_pending(self) -> None:
        """Complete every queued operation (CPU) or synchronize the device (CUDA)."""
        ...


class _CudaStream(Protocol):
    raw: torch.cuda.Stream


def cuda_stream_handle(stream: Stream) -> int:
    """The driver handle of a stream a CUDA device handed out (a ``CudaStream``)."""
    return int(cast(_CudaStream, stream).raw.cuda_stream)
