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
import sys
import types
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
    "CacheConfig": "kvsim.config",
    "OffloadOptions": "kvsim.config",
    "RequestContext": "kvsim.context",
    "InputError": "kvsim.errors",
    "InputWarning": "kvsim.errors",
    "LookupResult": "kvsim.offload",
    "OffloadManager": "kvsim.offload",
    "Result": "kvsim.results",
    "sweep": "kvsim.sweep",
    "Request": "kvsim.traces",
    "Trace": "kvsim.traces",
    "open_trace": "kvsim.traces",
    "trace_stats": "kvsim.traces.stats",
}

if TYPE_CHECKING:  # what IDEs and mypy see
    from kvsim.api import bundled_trace, generate, mrc, replay, requests_frame, simulate
    from kvsim.config import CacheConfig, OffloadOptions
    from kvsim.context import RequestContext
    from kvsim.errors import InputError, InputWarning
    from kvsim.offload import LookupResult, OffloadManager
    from kvsim.results import Result
    from kvsim.sweep import sweep
    from kvsim.traces import Request, Trace, open_trace
    from kvsim.traces.stats import trace_stats


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvsim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """``kvsim.sweep`` and ``kvsim.replay`` are functions, though submodules share their
    names: importing a submodule makes Python set it as the package's attribute, which
    would hide the function once loaded lazily. (``importlib.import_module("kvsim.sweep")``
    still gives the module.)"""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _EXPORTS:
            return  # the name stays the function's (__getattr__ loads it when asked)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
