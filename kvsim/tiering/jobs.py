"""A transfer between the CPU tier and a secondary tier, and how it ended."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey


@dataclass(slots=True)
class TransferJob:
    """One batched transfer: a promotion (secondary -> CPU) or a cascade (CPU -> secondary).

    ``chunk_ids`` are the CPU tier's slots, co-indexed with ``keys``; ``submit_time`` is on
    the manager's clock (always 0 in cache mode, which has no time)."""

    job_id: int
    keys: list[ChunkKey]
    chunk_ids: list[int]
    is_promotion: bool
    ctx: RequestContext
    submit_time: float = 0.0


@dataclass(frozen=True, slots=True)
class JobResult:
    """A finished job. On a failed promotion ``successful_keys`` names the keys that did
    arrive (None: all keys share the job's fate), as vLLM's ``JobResult``."""

    job_id: int
    success: bool
    successful_keys: tuple[ChunkKey, ...] | None = None
    transfer_time: float | None = None
    transfer_bytes: int | None = None
