"""kvsim: a simulation-first toolkit for LLM KV-cache offloading.

The Python API mirrors the command line:

* ``kvsim.replay(...)``      cache mode (hit ratios, stores, evictions) -> Result
* ``kvsim.simulate(...)``    timed mode (TTFT, throughput, PCIe traffic) -> Result
* ``kvsim.sweep(...)``       grids of runs -> one tidy DataFrame
* ``kvsim.mrc(...)``         the hit ratio at every CPU capacity, in one pass
* ``kvsim.trace_stats(...)`` and ``kvsim.generate(...)`` for workloads;
  ``kvsim.bundled_trace()`` is the trace shipped with the package

Every function takes its options as keywords (``help(kvsim.simulate)`` lists them) and
shows a progress bar with ``progress=True``. The building blocks (manager, policies,
traces, sizing) are importable for notebooks and for driving the real backend in ``real/``.
"""

from __future__ import annotations

from kvsim.api import bundled_trace, generate, mrc, replay, requests_frame, simulate
from kvsim.config import CacheConfig, OffloadOptions
from kvsim.context import RequestContext
from kvsim.errors import InputError, InputWarning
from kvsim.offload import LookupResult, OffloadManager
from kvsim.results import Result
from kvsim.sweep import sweep
from kvsim.traces import Request, Trace, open_trace
from kvsim.traces.stats import trace_stats

__version__ = "0.1.0"

__all__ = [
    "CacheConfig",
    "InputError",
    "InputWarning",
    "LookupResult",
    "OffloadManager",
    "OffloadOptions",
    "Request",
    "RequestContext",
    "Result",
    "Trace",
    "bundled_trace",
    "generate",
    "mrc",
    "open_trace",
    "replay",
    "requests_frame",
    "simulate",
    "sweep",
    "trace_stats",
]
