"""Timed mode: the discrete-event serving engine (see :mod:`kvsim.engine.engine`)."""

from kvsim.engine.clock import MonotonicClock, VirtualClock
from kvsim.engine.compute_model import ComputeParams, RooflineCompute, StepBatch
from kvsim.engine.engine import Engine, gpu_kv_blocks
from kvsim.engine.params import EngineParams
from kvsim.engine.phase_compute import PhaseCompute, PhaseProfile
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.transfer_model import (
    LINK_PRESETS,
    DirectionParams,
    TransferModelParams,
    get_link,
    load_transfer_profile,
)

__all__ = [
    "LINK_PRESETS",
    "ComputeParams",
    "DirectionParams",
    "Engine",
    "EngineParams",
    "MonotonicClock",
    "PhaseCompute",
    "PhaseProfile",
    "RooflineCompute",
    "SimulatedTransferBackend",
    "StepBatch",
    "TransferModelParams",
    "VirtualClock",
    "get_link",
    "gpu_kv_blocks",
    "load_transfer_profile",
]
