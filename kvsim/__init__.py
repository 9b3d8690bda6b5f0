"""kvsim: a simulation-first toolkit for LLM KV-cache offloading.

The Python API mirrors the command line: ``kvsim.replay(...)`` runs cache mode and
returns pandas tables; the building blocks (manager, policies, traces, sizing) are
importable for notebooks and for driving a real backend.
"""

from kvsim.api import replay
from kvsim.config import CacheConfig, OffloadOptions
from kvsim.context import RequestContext
from kvsim.errors import InputError
from kvsim.offload import LookupResult, OffloadManager
from kvsim.results import Result
from kvsim.traces import Request, Trace, open_trace

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
    "open_trace",
    "replay",
]
