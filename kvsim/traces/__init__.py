"""Trace model and streaming readers (Mooncake, Alibaba Bailian, Azure LLM 2023, native kvsim).

>>> from kvsim.traces import open_trace
>>> trace = open_trace("traces/samples/mooncake_small.jsonl")
>>> first = next(iter(trace))
"""

from .coerce import as_trace, frame_requests, requests_frame
from .formats.native import write_native
from .model import Request, Trace, TraceInfo
from .readers import DEFAULT_BLOCK_TOKENS, TRACE_FORMATS, open_trace, sniff_format

__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "TRACE_FORMATS",
    "Request",
    "Trace",
    "TraceInfo",
    "as_trace",
    "frame_requests",
    "open_trace",
    "requests_frame",
    "sniff_format",
    "write_native",
]
