"""kvsim: a simulation-first toolkit for LLM KV-cache offloading.

The Python API mirrors the command line:

* ``kvsim.replay(...)``      cache mode (hit ratios, stores, evictions) -> Result
* ``kvsim.simulate(...)``    timed mode (TTFT, throughput, PCIe traffic) -> Result
* ``kvsim.sweep(...)``       grids of runs -> one tidy DataFrame
* ``kvsim.trace_stats(...)`` and ``kvsim.generate(...)`` for workloads

The building blocks (manager, policies, traces, sizing) are importable for notebooks and
for driving the real backend in ``real/``.
"""

from __future__ import annotations

from kvsim.api import generate, replay, requests_frame, simulate
from kvsim.config import CacheConfig, OffloadOptions
from kvsim.context import RequestContext
from kvsim.errors import InputError
from kvsim.offload import LookupResult, OffloadManager
from kvsim.results import Result
from kvsim.sweep import sweep
from kvsim.traces import Request, Trace, open_trace
from kvsim.traces.stats import trace_stats

__version__ = "0.1.0"

__all__ = [
    "CacheConfig",
    "InputError",
    "LookupResult",
    "OffloadManager",
    "OffloadOptions",
    "Request",
    "RequestContext",
    "Result",
    "Trace",
    "generate",
    "open_trace",
    "replay",
    "requests_frame",
    "simulate",
    "sweep",
    "trace_stats",
]
