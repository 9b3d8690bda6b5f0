"""The async loop's record of a step between its launch and its processing, shared by the
engine's general step (``kvsim.engine.engine``) and its quiet iterations
(:mod:`kvsim.engine.quiet_loop`)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.request_state import SimRequest
from kvsim.engine.step_batch import StepBatch
from kvsim.engine.transfer_protocol import TransferResult


@dataclass(slots=True, eq=False)
class Launched:
    """One async-scheduled step between its launch and its processing."""

    step: int
    schedule_s: float  # host time of schedule()
    start_s: float  # forward start (after the previous forward and any flush stall)
    end_s: float  # forward end (== start_s when nothing was scheduled)
    stall_s: float
    batch: StepBatch
    entries: list[tuple[SimRequest, int, bool]]
    results: list[TransferResult]  # completions its worker calls saw
    n_preempted: int
    submitted: tuple[int, int]  # (loads, stores) its worker calls submitted
    progress: bool  # tokens, a flush stall, completions seen or stores queued
