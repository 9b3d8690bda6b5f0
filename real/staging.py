"""One host staging buffer, handed out in slices, instead of small allocations per job.

A job stages small int64 arrays through host memory: the GPU block ids and key seeds of its
pattern fill or byte check (copied to the device), and the check's mismatch counts (copied
back). On CUDA that memory must be page-locked for the copies to be asynchronous, and a
fresh ``cudaHostAlloc`` costs hundreds of microseconds: allocating per job would put those
calls inside the first jobs' timings. As vLLM's worker does, one pinned buffer is allocated
when the backend starts and reused.

Reuse is the hazard: the device reads a slice when its stream reaches the copy, long after
the host handed it out. So a slice (a :class:`Lease`) is given out again only once

* the *fence* recorded after its last device use has completed (``Lease.guard``), and
* when the host must read it afterwards (the counts), the host has released it
  (``Lease.release``).

The buffer is a ring: slices are cut in order, wrapping to the start; a slice whose fence has
not completed when the ring comes round is waited for (``fence.synchronize()``, counted in
``waits``); one the host still has to read is handed to its ``reclaim`` (the owner waits
for its fence, reads it and releases it; counted in ``waits`` too), and only one without
such a hook makes the ring grow into a new, larger buffer (``grows``; the old one stays
alive until its slices are settled). Nothing here knows CUDA:
the buffer comes from ``allocate`` and a fence is anything with ``query`` and
``synchronize`` (a :class:`real.device.Event`, or a ``torch.cuda.Event``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

Allocate = Callable[[int], torch.Tensor]  # words -> an int64 host tensor of that many words

DEFAULT_WORDS = 1 << 18  # 2 MiB: about 50,000 staged blocks in flight before any wait


class Fence(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


def host_words(words: int) -> torch.Tensor:
    """Plain (pageable) host memory: the CPU stand-ins' staging."""
    return torch.empty(words, dtype=torch.int64)


def pinned_words(words: int) -> torch.Tensor:
    """Page-locked host memory from torch's pinned allocator (CUDA only)."""
    return torch.empty(words, dtype=torch.int64, pin_memory=True)


@dataclass(eq=False)
class Lease:
    """Words ``[start, stop)`` of buffer ``generation``; see the module docstring."""

    generation: int
    start: int
    stop: int
    words: torch.Tensor
    fence: Fence | None = None
    hold: bool = False  # the host reads it after the fence: free only once released
    released: bool = False
    reclaim: Callable[[], object] | None = None  # reads and releases a held slice now

    def guard(self, fence: Fence, *, hold: bool = False) -> None:
        """Free once ``fence`` completed (and, with ``hold``, once released too)."""
        self.fence = fence
        self.hold = hold

    def release(self) -> None:
        """The host is done with it (after reading it, or when the device never got it)."""
        self.released = True

    def settled(self, *, wait: bool) -> bool:
        """Whether the slice may be handed out again (``wait``: block on its fence)."""
        if self.hold and not self.released:
            return False
        if self.fence is None:
            return self.released  # never handed to the device: the host's to release
        if self.fence.query():
            return True
        if wait:
            self.fence.synchronize()
            return True
        return False


@dataclass
class StagingBuffer:
    """A ring of int64 words (``allocate(words)`` builds each buffer, once per growth)."""

    allocate: Allocate = host_words
    words: int = DEFAULT_WORDS
    allocations: int = 0
    waits: int = 0
    grows: int = 0
    _buffers: list[torch.Tensor] = field(default_factory=list)
    _live: list[Lease] = field(default_factory=list)
    _head: int = 0

    def __post_init__(self) -> None:
        if self.words <= 0:
            raise ValueError(f"a staging buffer needs a positive size, got {self.words}")
        self._new_buffer(self.words)

    def _new_buffer(self, words: int) -> None:
        self._buffers.append(self.allocate(words))
        self.allocations += 1
        self.words = words
        self._head = 0

    @property
    def generation(self) -> int:
        return len(self._buffers) - 1

    def take(self, n: int) -> Lease:
        """A slice of ``n`` words; the caller guards or releases it."""
        if n <= 0:
            lease = Lease(self.generation, 0, 0, self._buffers[-1][:0])
            lease.release()
            return lease
        self._prune()
        while True:
            if n > self.words:
                self._grow(n)
                continue
            start = self._head if self._head + n <= self.words else 0
            if self._make_room(start, start + n):
                break
            self._grow(n)
        self._head = start + n
        lease = Lease(self.generation, start, start + n, self._buffers[-1][start : start + n])
        self._live.append(lease)
        return lease

    def _prune(self) -> None:
        """Forget settled leases from the oldest on (cheap: stops at the first busy one)."""
        i = 0
        while i < len(self._live) and self._live[i].settled(wait=False):
            i += 1
        del self._live[:i]

    def _make_room(self, start: int, stop: int) -> bool:
        """Settle every live lease of this buffer overlapping ``[start, stop)``; False when
        one is held by the host (the ring must grow instead)."""
        gen = self.generation
        overlapping = [
            lease
            for lease in self._live
            if lease.generation == gen and lease.start < stop and start < lease.stop
        ]
        for lease in overlapping:
            if lease.settled(wait=False):
                continue
            self.waits += 1
            if lease.hold and not lease.released:
                if lease.reclaim is None:
                    return False
                lease.reclaim()
                if not lease.released:
                    return False
            lease.settled(wait=True)
        self._live = [x for x in self._live if x not in overlapping]
        return True

    def _grow(self, n: int) -> None:
        self.grows += 1
        self._new_buffer(max(2 * self.words, n))
