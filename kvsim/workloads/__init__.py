"""Workloads as the benchmark tools make them: inference-perf's ``shared_prefix`` and
``vllm bench serve``'s ``random`` data, sent at a constant or Poisson rate or by a closed
loop of clients, in stages (see ``docs/experiments.md``)."""

from kvsim.workloads.build import Workload, build_workload
from kvsim.workloads.source import ClientSource
from kvsim.workloads.spec import (
    Load,
    LoadStage,
    RandomWorkload,
    SharedPrefixWorkload,
    WorkloadSpec,
    load_load,
    load_workload,
)

__all__ = [
    "ClientSource",
    "Load",
    "LoadStage",
    "RandomWorkload",
    "SharedPrefixWorkload",
    "Workload",
    "WorkloadSpec",
    "build_workload",
    "load_load",
    "load_workload",
]
