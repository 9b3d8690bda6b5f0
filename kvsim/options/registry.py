"""Every user-facing structure by name, for ``kvsim schema NAME`` (its JSON Schema, for
editors) and for anything else that lists them.

Each entry is ``module:Attribute`` of a :class:`kvsim.options.schema.Schema`, imported only
when asked for, so a structure may live in any layer (the sweep spec, the measurements
file) without this vocabulary module importing it. Add a structure here (one line) or,
from a plug-in, with :func:`register_schema`.
"""

from __future__ import annotations

import importlib

from kvsim.core.errors import InputError, did_you_mean
from kvsim.options.schema import Schema

__all__ = ["SCHEMAS", "register_schema", "schema_named"]

SCHEMAS: dict[str, str] = {
    "offload-options": "kvsim.options.offload:OffloadOptions",
    "replay-options": "kvsim.options.runs:ReplayOptions",
    "simulate-options": "kvsim.options.runs:SimulateOptions",
    "engine-params": "kvsim.options.engine:EngineParams",
    "kv-connector-extra-config": "kvsim.options.vllm:KVConnectorExtraConfig",
    "kv-transfer-config": "kvsim.options.vllm:KVTransferConfig",
    "gpu-spec": "kvsim.specs.hardware:GpuSpec",
    "link-profile": "kvsim.engine.link_file:LinkProfileFile",
    "constant-link": "kvsim.engine.link_file:ConstantLinkFile",
    "compute-profile-roofline": "kvsim.engine.compute_file:RooflineProfileFile",
    "compute-profile-linear": "kvsim.engine.compute_file:LinearProfileFile",
    "compute-profile-phases": "kvsim.engine.compute_file:PhasesProfileFile",
    "tier-device": "kvsim.tiering.device_file:DeviceFile",
    "secondary-tiers": "kvsim.options.tiers:SecondaryTiers",
    "backpressure": "kvsim.options.tiers:BackpressureConfig",
    "sweep": "kvsim.sweeps.spec_schema:SweepSpecFile",
    "workload-shared-prefix": "kvsim.workloads.spec:SharedPrefixWorkload",
    "workload-random": "kvsim.workloads.spec:RandomWorkload",
    "load": "kvsim.workloads.spec:Load",
    "measurements": "kvsim.accuracy.measurements:MeasurementsFile",
}


def register_schema(name: str, target: str) -> None:
    """Make ``target`` (``module:Attribute``) known as ``name``; a different target under a
    name already taken is an error (two structures, one name)."""
    if SCHEMAS.get(name, target) != target:
        raise ValueError(f"schema {name!r} is already {SCHEMAS[name]!r}")
    SCHEMAS[name] = target


def schema_named(name: str) -> type[Schema]:
    """The structure registered as ``name``; an unknown name is a one-line
    :class:`InputError` with the closest known one."""
    target = SCHEMAS.get(name)
    if target is None:
        raise InputError(
            f"unknown schema {name!r}{did_you_mean(name, SCHEMAS)}; known: {', '.join(SCHEMAS)}"
        )
    module, _, attribute = target.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    if not (isinstance(found, type) and issubclass(found, Schema)):
        raise TypeError(f"{target} is not a Schema")
    return found
