"""A cache-mode replay of one trace with one resolved configuration, as ``kvsim.replay``
returns it: the protocol, where the rows go, the summary, and the warning when stores fail
for want of room. :mod:`kvsim.api` checks the keywords and builds the configuration."""

from __future__ import annotations

import gzip
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvsim.cachemode import REQUEST_COLUMNS, CacheReplay
from kvsim.cachemode.driver import write_requests_csv
from kvsim.core.errors import InputError, InputWarning
from kvsim.options.config import CacheConfig
from kvsim.options.runs import ReplayOptions
from kvsim.report.result import Result
from kvsim.traces import Trace
from kvsim.traces.model import Request


def _counted(requests: Iterable[Request], progress: Callable[[int], None]) -> Iterable[Request]:
    for req in requests:
        yield req
        progress(1)


def request_total(tr: Trace) -> int | None:
    """How many requests a replay of ``tr`` reads, for the progress bar: a file's lines are
    counted, not parsed (a header line aside), so the bar costs a fraction of the run."""
    path = tr.path
    if os.path.isfile(path):
        opener: Callable[..., Any] = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            n = int(sum(buf.count(b"\n") for buf in iter(lambda: f.read(1 << 20), b"")))
        n -= tr.format in ("azure", "native")  # a CSV header, a native trace's header line
    elif path.startswith("<"):  # in memory: counting is cheap
        n = sum(1 for _ in tr)
    else:  # a stream: unknown until read
        return None
    return n if tr.limit is None else min(n, tr.limit)


def replay_trace(
    tr: Trace, config: CacheConfig, run: ReplayOptions, progress: Callable[[int], None] | None
) -> Result:
    """One cache-mode replay of ``tr`` with ``config`` (prefix or object protocol; rows kept,
    streamed to ``run.requests_csv`` or dropped) as :func:`kvsim.replay` returns it; warns
    when stores failed for want of room while chunked prefill is off."""
    protocol, requests_csv = run.protocol, run.requests_csv
    if protocol != "prefix":
        from kvsim.cachemode.object_protocol import replay_config

        requests: Iterable[Request] = tr if progress is None else _counted(tr, progress)
        if requests_csv is not None:
            raise InputError("--requests-csv is for --protocol prefix only")
        return Result(
            summary={
                "trace": str(tr.path),
                **replay_config(requests, config, protocol),
                **config.capacity_summary(),
            },
            tables={},
            config=config.as_dict(),
        )
    # the trace is read for its future only by policies that need it
    replay = CacheReplay(config, requests_for_future=tr, fused=run.fused)
    tables = {}
    if requests_csv is not None:
        summary = write_requests_csv(requests_csv, replay, tr, progress)
    elif run.per_request:
        import pandas as pd

        rows: list[tuple[Any, ...]] = []
        summary = replay.run(tr, rows.append, progress=progress)
        tables["requests"] = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
    else:
        summary = replay.run(tr, progress=progress)
    _note_failed_stores(summary, config)
    return Result(
        summary={"trace": str(tr.path), **summary, **config.capacity_summary()},
        tables=tables,
        config=config.as_dict(),
    )


def _note_failed_stores(summary: Mapping[str, Any], config: CacheConfig) -> None:
    """Warn when stores failed for want of room and chunked prefill is off: vLLM stores a
    step's chunks all or nothing, so a tier smaller than one whole prompt fails silently
    otherwise, while vLLM's own chunked prefill would store such a prompt step by step."""
    failures = int(summary.get("allocation_failures") or 0)
    if not failures or config.prefill_chunk_tokens is not None:
        return
    warnings.warn(
        f"{failures:,} of {int(summary.get('requests') or 0):,} requests could not store "
        f"their chunks: the CPU tier ({config.num_chunks:,} chunks of {config.chunk_tokens} "
        "tokens) is smaller than what one whole prompt stores at once (vLLM stores a step's "
        "chunks all or nothing); vLLM's chunked prefill stores a long prompt over several "
        "steps: --prefill-chunk-tokens 8192 (prefill_chunk_tokens, vLLM's default "
        "max_num_batched_tokens) models it",
        InputWarning,
        stacklevel=3,
    )
