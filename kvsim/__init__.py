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

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it. Imported on first use (PEP 562), so that
#: ``kvsim --help``, ``kvsim policies`` and a cache-mode replay never pay for pandas,
#: matplotlib or torch they do not use.
_EXPORTS = {
    "bundled_trace": "kvsim.api",
    "generate": "kvsim.api",
    "mrc": "kvsim.api",
    "replay": "kvsim.api",
    "requests_frame": "kvsim.api",
    "simulate": "kvsim.api",
    "CacheConfig": "kvsim.options.offload",
    "OffloadOptions": "kvsim.options.offload",
    "RequestContext": "kvsim.core.context",
    "InputError": "kvsim.core.errors",
    "InputWarning": "kvsim.core.errors",
    "LookupResult": "kvsim.manager.offload",
    "OffloadManager": "kvsim.manager.offload",
    "Result": "kvsim.report.result",
    "sweep": "kvsim.sweeps",
    "Request": "kvsim.traces",
    "Trace": "kvsim.traces",
    "open_trace": "kvsim.traces",
    "trace_stats": "kvsim.traces.stats",
}

if TYPE_CHECKING:  # what IDEs and mypy see
    from kvsim.api import bundled_trace, generate, mrc, replay, requests_frame, simulate
    from kvsim.core.context import RequestContext
    from kvsim.core.errors import InputError, InputWarning
    from kvsim.manager.offload import LookupResult, OffloadManager
    from kvsim.options.offload import CacheConfig, OffloadOptions
    from kvsim.report.result import Result
    from kvsim.sweeps import sweep
    from kvsim.traces import Request, Trace, open_trace
    from kvsim.traces.stats import trace_stats


#: subpackages the docs reach as attributes (``kvsim.plots.fleet_balance``), imported
#: when first reached, as ``import kvsim.plots`` would
_SUBPACKAGES = frozenset({"accuracy", "fleet", "plots", "sweeps", "traces", "workloads"})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"kvsim.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvsim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBPACKAGES)


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
