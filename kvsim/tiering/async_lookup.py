"""Existence checks answered a step later, as vLLM's ``AsyncLookupManager`` (``fs``, ``obj``).

A tier that must ask a file system or an object store whether it holds a chunk cannot
answer inside the scheduler's step. The first lookup of a key queues a probe and says
"don't know yet" (the manager's RETRY); at the end of the step the queued probes go to a
worker as one batch; the worker answers from what the tier holds *when it runs*; the
answers are applied at the next lookup or the next flush. A verdict is kept while some
live request asked for it, so a request sees one answer per key, and a failed load marks
its keys missing (a verdict that would otherwise promote the same doomed chunk forever).

The worker is :meth:`AsyncLookups.answer`: cache mode runs it right after each flush (no
time passes); a timed model or a test runs it when the tier would have answered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from kvsim.core.keys import ChunkKey


class Phase(Enum):
    QUEUED = 1  # asked this step, not yet sent to the worker
    IN_FLIGHT = 2  # with the worker
    RESOLVED = 3  # answered


@dataclass(slots=True)
class _Probe:
    generation: int
    phase: Phase = Phase.QUEUED
    found: bool | None = None
    requests: set[Hashable] = field(default_factory=set)


class AsyncLookups:
    """Per-tier probe states; ``probe(key)`` is the worker's check of the backing store."""

    def __init__(self, probe: Callable[[ChunkKey], bool]) -> None:
        self._probe = probe
        self._probes: dict[ChunkKey, _Probe] = {}
        self._request_keys: dict[Hashable, set[ChunkKey]] = {}
        self._next_generation = 0
        self._step_batch: list[tuple[ChunkKey, int]] = []
        self._to_worker: deque[list[tuple[ChunkKey, int]]] = deque()
        self._answers: deque[list[tuple[ChunkKey, int, bool]]] = deque()
        self._drain_at_next_lookup = False

    def lookup(self, key: ChunkKey, req_id: Hashable) -> bool | None:
        """True / False once answered; None while the probe is queued or with the worker."""
        if self._drain_at_next_lookup:
            self.drain()
            self._drain_at_next_lookup = False
        probe = self._probes.get(key)
        if probe is None:
            probe = _Probe(self._next_generation)
            self._next_generation += 1
            self._probes[key] = probe
            self._step_batch.append((key, probe.generation))
        probe.requests.add(req_id)
        self._request_keys.setdefault(req_id, set()).add(key)
        return probe.found

    def flush(self) -> None:
        """End of step: apply answers, send this step's probes to the worker as one batch."""
        self.drain()
        self._drain_at_next_lookup = True
        batch, self._step_batch = self._step_batch, []
        sent = []
        for key, generation in batch:
            probe = self._probes.get(key)
            if probe is None or probe.generation != generation:
                continue
            probe.phase = Phase.IN_FLIGHT
            sent.append((key, generation))
        if sent:
            self._to_worker.append(sent)

    def answer(self, batches: int | None = None) -> None:
        """The worker: answer the batches sent so far (the first ``batches`` of them when
        given), from what the tier holds now."""
        while self._to_worker and (batches is None or batches > 0):
            if batches is not None:
                batches -= 1
            batch = self._to_worker.popleft()
            self._answers.append([(key, gen, self._probe(key)) for key, gen in batch])

    @property
    def batches_sent(self) -> int:
        """Batches with the worker, not answered yet."""
        return len(self._to_worker)

    def drain(self) -> None:
        """Apply the worker's answers (a probe nobody waits for any more is dropped)."""
        while self._answers:
            for key, generation, found in self._answers.popleft():
                probe = self._probes.get(key)
                if probe is None or probe.generation != generation:
                    continue
                if not probe.requests:
                    del self._probes[key]
                    continue
                probe.found = found
                probe.phase = Phase.RESOLVED

    def mark_miss(self, keys: Iterable[ChunkKey]) -> None:
        """A load of these keys failed: answered verdicts become "absent"."""
        for key in keys:
            probe = self._probes.get(key)
            if probe is not None and probe.phase is Phase.RESOLVED:
                probe.found = False

    def cleanup(self, req_id: Hashable) -> None:
        """The request is done; verdicts only it held are forgotten (in-flight ones stay
        until answered, so a later request can share the probe)."""
        for key in self._request_keys.pop(req_id, ()):
            probe = self._probes[key]
            probe.requests.discard(req_id)
            if not probe.requests and probe.phase is not Phase.IN_FLIGHT:
                del self._probes[key]

    def __len__(self) -> int:
        return len(self._probes)
