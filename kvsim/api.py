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

REQUEST_FIELDS = ("request_id", "arrival_s", "input_tokens", "output_tokens", "block_hashes", "session_id")


def requests_frame(requests: Iterable[Request], block_tokens: int) -> pd.DataFrame:
    """Requests as a DataFrame (one row each, the :class:`Request` fields as columns).

    ``frame.attrs["block_tokens"]`` keeps the hash-block size, so the frame can be passed
    back to ``replay`` / ``simulate`` as a trace.
    """
    frame = pd.DataFrame.from_records(
        [(r.request_id, r.arrival_s, r.input_tokens, r.output_tokens, r.block_hashes, r.session_id)
         for r in requests], columns=list(REQUEST_FIELDS))
    frame.attrs["block_tokens"] = block_tokens
    return frame


def _frame_requests(frame: pd.DataFrame) -> list[Request]:
    missing = [c for c in REQUEST_FIELDS[1:5] if c not in frame.columns]
    if missing:
        from kvsim.errors import InputError

        raise InputError(f"a requests DataFrame needs the columns {', '.join(missing)}")
    ids = frame["request_id"] if "request_id" in frame else range(len(frame))
    sessions = frame["session_id"] if "session_id" in frame else [None] * len(frame)
    return [
        Request(int(i), float(t), int(n_in), int(n_out), tuple(int(h) for h in hashes),
                None if s is None or s != s else int(s))
        for i, t, n_in, n_out, hashes, s in zip(ids, frame["arrival_s"], frame["input_tokens"],
                                                frame["output_tokens"], frame["block_hashes"], sessions)
    ]


def generate(kind: str, n_requests: int = 1000, seed: int = 0, **knobs: Any) -> pd.DataFrame:
    """A synthetic workload as a DataFrame (see ``kvsim.traces.synthetic`` for kinds and knobs);
    pass it to ``replay`` / ``simulate`` as the trace."""
    from kvsim.traces.synthetic import generate as generate_requests

    block_tokens = int(knobs.get("block_tokens", 512))
    return requests_frame(generate_requests(kind, n_requests=n_requests, seed=seed, **knobs), block_tokens)


def as_trace(trace: str | os.PathLike | Trace | Iterable[Request] | pd.DataFrame, *,
             block_tokens: int | None = None, limit: int | None = None, fmt: str | None = None) -> Trace:
    """Accept a path, a :class:`Trace`, a requests DataFrame, or a list of requests."""
    if isinstance(trace, pd.DataFrame):
        bt = block_tokens or trace.attrs.get("block_tokens", 512)
        return as_trace(Trace.from_requests(_frame_requests(trace), bt), limit=limit)
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
    protocol: str = "prefix",
    fused: bool | None = None,
    **options: Any,
) -> Result:
    """Cache-mode replay (``protocol="object"``: every chunk key is a get, see
    :mod:`kvsim.object_cache`). Keywords are :class:`kvsim.config.OffloadOptions` fields, e.g.
    ``replay(path, cpu_gib=64, model="llama-3.1-8b", policy="arc", gpu_blocks=2000)``.
    ``fused=False`` runs ``lru`` and ``arc`` through the full manager protocol instead of their fused tiers
    (same decisions, slower); see :class:`kvsim.replay.CacheReplay`.

    Returns a Result whose ``summary`` holds the totals and ratios and whose ``requests``
    table has one row per request (when ``per_request``).
    """
    tr = as_trace(trace, block_tokens=options.get("block_tokens"), limit=limit)
    config = make_options(vllm_config, **options).resolve(tr.block_tokens)
    if protocol != "prefix":
        from kvsim.object_cache import replay_config

        return Result(summary={"trace": str(tr.path), **replay_config(tr, config, protocol)},
                      tables={}, config=config.as_dict())
    run = CacheReplay(config, requests_for_future=tr, fused=fused)  # the future: read only if needed
    rows: list[tuple] = []
    summary = run.run(tr, rows.append if per_request else None)
    tables = {}
    if per_request:
        tables["requests"] = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
    summary = {"trace": str(tr.path), **summary}
    return Result(summary=summary, tables=tables, config=config.as_dict())


