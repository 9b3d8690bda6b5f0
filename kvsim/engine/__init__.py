"""Timed mode: the discrete-event serving engine (see :mod:`kvsim.engine.engine`).

The names below load on first use (PEP 562): importing one module of the package (the
transfer protocol, as ``real.gpu_check`` does on a bare GPU image) runs no other.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "MonotonicClock": "kvsim.engine.clock",
    "VirtualClock": "kvsim.engine.clock",
    "ComputeParams": "kvsim.engine.compute_model",
    "RooflineCompute": "kvsim.engine.compute_model",
    "StepBatch": "kvsim.engine.step_batch",
    "Engine": "kvsim.engine.engine",
    "gpu_kv_blocks": "kvsim.engine.engine",
    "EngineParams": "kvsim.engine.params",
    "PhaseCompute": "kvsim.engine.phase_compute",
    "PhaseProfile": "kvsim.engine.phase_compute",
    "SimulatedTransferBackend": "kvsim.engine.sim_backend",
    "LINK_PRESETS": "kvsim.engine.transfer_model",
    "DirectionParams": "kvsim.engine.transfer_model",
    "TransferModelParams": "kvsim.engine.transfer_model",
    "get_link": "kvsim.engine.transfer_model",
    "load_transfer_profile": "kvsim.engine.transfer_model",
}

if TYPE_CHECKING:  # what IDEs and mypy see
    from kvsim.engine.clock import MonotonicClock, VirtualClock
    from kvsim.engine.compute_model import ComputeParams, RooflineCompute
    from kvsim.engine.engine import Engine, gpu_kv_blocks
    from kvsim.engine.params import EngineParams
    from kvsim.engine.phase_compute import PhaseCompute, PhaseProfile
    from kvsim.engine.sim_backend import SimulatedTransferBackend
    from kvsim.engine.step_batch import StepBatch
    from kvsim.engine.transfer_model import (
        LINK_PRESETS,
        DirectionParams,
        TransferModelParams,
        get_link,
        load_transfer_profile,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvsim.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


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
