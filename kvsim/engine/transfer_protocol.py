"""The transfer-backend protocol the engine drives: submit / poll / wait.

Two implementations exist: the simulated one (a cost model with per-direction FIFO
queues on the virtual clock, ``kvsim.engine.transfer_model``) and the real one
(``real.transfer``: torch tensors, CUDA streams and events, or CPU tensors without
CUDA). The engine never knows which one it drives.

Semantics (vLLM 0.33 worker, docs/vllm-offload-semantics.md §5.7 and §6.3):
* three queues: ``store`` (GPU->CPU), ``load`` (CPU->GPU) and ``expedited`` loads;
  each runs its jobs strictly FIFO, one at a time; the queues run concurrently;
* a store reads GPU blocks only after the compute that wrote them (``after_time``);
* ``poll(now)`` returns the jobs finished by ``now``, in submission order per queue;
* ``wait(job_ids)`` blocks until those jobs are done and returns their results;
* a failed copy is reported with ``success=False`` (the engine then calls
  ``complete_store(success=False)`` and the chunk is freed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

STORE = "store"
LOAD = "load"
EXPEDITED = "expedited"
DIRECTIONS = (STORE, LOAD, EXPEDITED)


@dataclass(frozen=True)
class TransferJob:
    """One copy job as a backend sees it: what to move, where, and when it was submitted."""

    job_id: int
    direction: str  # STORE, LOAD or EXPEDITED
    gpu_blocks: Sequence[int]  # GPU block ids (source of a store, destination of a load)
    chunk_ids: Sequence[int]  # CPU chunk ids (destination of a store, source of a load)
    nbytes: int  # bytes moved by the job
    # copy descriptors (blocks x layers in vLLM's layout), pages of nbytes / num_copies
    # bytes each: the page size and count decide the copy path (kvsim.engine.copy_paths)
    num_copies: int
    keys: Sequence[object] = ()  # offload keys, for integrity checks in the real backend
    submit_time: float = 0.0  # clock time when submitted


@dataclass(frozen=True)
class TransferResult:
    """A finished job as a backend reports it: its timing and whether the copy succeeded."""

    job_id: int
    direction: str
    success: bool
    nbytes: int
    start_time: float  # when the copy started (after queueing)
    end_time: float  # when it completed
    submit_time: float = 0.0

    @property
    def duration(self) -> float:
        return self.end_time - self.start_time


class TransferBackend(Protocol):
    """The copy engine the connector drives; the simulated and real backends both implement it."""

    def submit(self, job: TransferJob, now: float) -> None:
        """Queue a job at clock time ``now``."""

    def poll(self, now: float) -> list[TransferResult]:
        """Jobs completed by ``now`` (each reported once), in order per direction."""

    def wait(self, job_ids: Sequence[int], now: float) -> tuple[float, list[TransferResult]]:
        """Block until the jobs finish; returns the clock time when they all are, and results."""

    def next_completion_time(self) -> float | None:
        """Earliest time a pending job completes (simulated backends), else None."""

    def host_free_time(self) -> float:
        """When the worker thread ends the host part (descriptor building, driver calls) of
        every job submitted so far; 0.0 where that time is real (a real ``submit`` returns
        after it)."""
