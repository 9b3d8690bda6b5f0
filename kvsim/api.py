"""The Python API: one call per job, returning :class:`kvsim.results.Result` values."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pandas as pd

from kvsim.config import OffloadOptions, load_vllm_config, options_from_vllm_config
from kvsim.replay import REQUEST_COLUMNS, CacheReplay
from kvsim.results import Result
from kvsim.traces import Request, Trace, open_trace


def as_trace(trace: str | os.PathLike | Trace | Iterable[Request], *, block_tokens: int | None = None,
             limit: int | None = None, fmt: str | None = None) -> Trace:
    """Accept a path, a :class:`Trace`, or a list of requests."""
    if isinstance(trace, Trace):
        if limit is not None:
            t = Trace(trace.info, limit)
            t._requests = trace._requests
            return t
        return trace
    if isinstance(trace, (str, os.PathLike)):
        return open_trace(trace, fmt=fmt, block_tokens=block_tokens, limit=limit)
    reqs = list(trace)
    t = Trace.from_requests(reqs, block_tokens or 512)
    return as_trace(t, limit=limit) if limit is not None else t


def make_options(vllm_config: str | dict | None = None, **options: Any) -> OffloadOptions:
    """Options from keywords, on top of a vLLM ``kv_connector_extra_config`` if given."""
    base = OffloadOptions()
    if vllm_config is not None:
        extra = vllm_config if isinstance(vllm_config, dict) else load_vllm_config(vllm_config)
        base = options_from_vllm_config(extra, base)
    explicit = {k: v for k, v in options.items() if v is not None}
    if "cpu_chunks" in explicit or "cpu_gib" in explicit:
        base = base.with_(cpu_bytes=None)
    return base.with_(**explicit)


def replay(
    trace: str | os.PathLike | Trace | Iterable[Request],
    *,
    limit: int | None = None,
    per_request: bool = True,
    vllm_config: str | dict | None = None,
    **options: Any,
) -> Result:
    """Cache-mode replay. Keywords are :class:`kvsim.config.OffloadOptions` fields, e.g.
    ``replay(path, cpu_gib=64, model="llama-3.1-8b", policy="arc", gpu_blocks=2000)``.

    Returns a Result whose ``summary`` holds the totals and ratios and whose ``requests``
    table has one row per request (when ``per_request``).
    """
    tr = as_trace(trace, block_tokens=options.get("block_tokens"), limit=limit)
    config = make_options(vllm_config, **options).resolve(tr.block_tokens)
    future = tr if _needs_future(config.policy, config.policy_module) else None
    run = CacheReplay(config, requests_for_future=future)
    rows: list[tuple] = []
    summary = run.run(tr, rows.append if per_request else None)
    tables = {}
    if per_request:
        tables["requests"] = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
    summary = {"trace": str(tr.path), **summary}
    return Result(summary=summary, tables=tables, config=config.as_dict())


def _needs_future(policy: str, module: str | None) -> bool:
    from kvsim.policies.registry import eviction_policy_class

    return bool(getattr(eviction_policy_class(policy, module), "needs_future", False))
