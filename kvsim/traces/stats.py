"""What a workload looks like before any cache sees it: sizes, reuse, popularity, arrivals.

Only *complete* blocks count (``Request.complete_blocks``): the trailing partial block of a
Mooncake prompt is never cached, so it is never reused. Definitions (the tests pin them on
hand-computed traces):

- ``infinite_cache_hit_ratio``: with unbounded memory, each request hits the leading run of
  its blocks seen in any earlier request; the ratio is those hits over all block accesses.
  It is the ceiling of every eviction policy's combined hit ratio.
- reuse distance of an access: the number of *distinct other* blocks accessed since the
  previous access of the same block (LRU stack distance); an LRU cache of more than that
  many blocks hits it. Reuse time: the arrival-time difference between the two requests.
- ``reuse_share_top1pct`` / ``top10pct``: the share of all reuses (accesses after the first)
  that fall on the 1% / 10% most reused blocks.
- with a model, ``reuse_distance_p50_gib`` (p90, p99): the CPU memory an LRU tier of
  one-block chunks needs to keep that reuse, ``(distance + 1)`` chunks of vLLM's row bytes
  (``kvsim replay --cpu-gib`` sizes the same way); ``unique_blocks_gib``: every block at once,
  the size past which no cache gains anything.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from kvsim.core.errors import InputError, InputWarning
from kvsim.core.fenwick import Fenwick
from kvsim.core.units import GIB
from kvsim.report.result import Result

from .coerce import as_trace
from .model import Request, Trace, late_arrivals

QUANTILES = (0.5, 0.9, 0.99)


def _describe(name: str, values: np.ndarray, unit: str) -> dict[str, Any]:
    if len(values) == 0:
        return {
            "quantity": name,
            "unit": unit,
            "count": 0,
            "mean": math.nan,
            **{f"p{round(q * 100)}": math.nan for q in QUANTILES},
            "max": math.nan,
        }
    qs = np.quantile(values, QUANTILES)
    return {
        "quantity": name,
        "unit": unit,
        "count": len(values),
        "mean": float(values.mean()),
        **{f"p{round(q * 100)}": float(v) for q, v in zip(QUANTILES, qs)},
        "max": float(values.max()),
    }


def _auto_bin(duration: float) -> float:
    """About 50 bins with a round width (1, 2, 5 x 10^k seconds)."""
    if duration <= 0:
        return 1.0
    raw = duration / 50
    base = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * base:
            return float(m * base)
    return float(10 * base)


MAX_ARRIVAL_BINS = 1_000_000


def _check_bin(bin_s: float, duration: float) -> float:
    """A window width that is a finite positive number and gives a table that fits in memory
    (a typo such as 1e-7 would otherwise ask for billions of windows)."""
    if isinstance(bin_s, bool) or not isinstance(bin_s, (int, float)):
        raise InputError(f"--bin-s must be a number of seconds, got {bin_s!r}")
    if not (math.isfinite(bin_s) and bin_s > 0):
        raise InputError(f"--bin-s must be a finite positive number of seconds, got {bin_s}")
    if duration / bin_s >= MAX_ARRIVAL_BINS:
        raise InputError(
            f"--bin-s {bin_s} splits the trace's {duration:,.1f} s into more than "
            f"{MAX_ARRIVAL_BINS:,} windows; use a wider window"
        )
    return float(bin_s)


def trace_stats(
    trace: str | os.PathLike[str] | Trace | Iterable[Request],
    *,
    limit: int | None = None,
    block_tokens: int | None = None,
    bin_s: float | None = None,
    model: str | None = None,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    gpu_block_tokens: int = 16,
) -> Result:
    """Statistics of a trace: ``summary`` (flat numbers) and tables.

    Tables: ``requests`` (one row per request with its ``blocks`` and infinite-cache
    ``hit_blocks``), ``reuses`` (one row per reuse: ``block``, ``distance``, ``time_s``),
    ``popularity`` (``block``, ``accesses``; most accessed first), ``arrivals`` (``start_s``,
    ``requests``, ``rate_rps`` per ``bin_s`` window) and ``distributions`` (mean and
    percentiles of prompt/output tokens, reuse distance and reuse time; with a ``model``,
    sized at ``tp`` with ``kv_cache_dtype`` as :func:`kvsim.replay` sizes it, also the LRU
    size that keeps each reuse in GiB).
    """
    from kvsim.specs.sizing import refuse_sizing_without_model

    refuse_sizing_without_model(model, tp, kv_cache_dtype, gpu_block_tokens)
    tr = as_trace(trace, block_tokens=block_tokens, limit=limit)
    bt = block_tokens or tr.block_tokens
    row = _block_row_bytes(bt, model, tp, kv_cache_dtype, gpu_block_tokens)
    req_rows: list[tuple[int, float, int, int, int, int]] = []
    accesses: list[tuple[int, float]] = []  # (block, arrival_s) in access order
    seen: set[int] = set()
    for r in tr:
        n = r.complete_blocks(bt)
        ids = r.block_hashes[:n]
        hit = 0
        while hit < n and ids[hit] in seen:
            hit += 1
        seen.update(ids)
        req_rows.append((r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, n, hit))
        accesses.extend((b, r.arrival_s) for b in ids)
    late, _ = late_arrivals(row[1] for row in req_rows)
    if late:
        warnings.warn(
            f"{tr.path}: {late:,} request(s) arrive earlier than a request before them; the "
            "statistics read the file in its order, as kvsim replay does (kvsim simulate "
            "sorts it by arrival), so some reuse times are negative",
            InputWarning,
            stacklevel=2,
        )
    requests = pd.DataFrame.from_records(
        req_rows,
        columns=["request", "arrival_s", "prompt_tokens", "output_tokens", "blocks", "hit_blocks"],
    )

    # reuse distance (distinct blocks in between) and reuse time, O(N log N)
    fw = Fenwick(len(accesses))  # position p of the access stream is index p + 1
    last_pos: dict[int, int] = {}
    last_time: dict[int, float] = {}
    counts: dict[int, int] = {}
    reuse_block, reuse_dist, reuse_time = [], [], []
    for pos, (b, t) in enumerate(accesses):
        prev = last_pos.get(b)
        if prev is not None:
            reuse_block.append(b)
            reuse_dist.append(fw.prefix(pos) - fw.prefix(prev + 1))  # accesses strictly between
            reuse_time.append(t - last_time[b])
            fw.add(prev + 1, -1)
        fw.add(pos + 1, 1)
        last_pos[b] = pos
        last_time[b] = t
        counts[b] = counts.get(b, 0) + 1
    reuses = pd.DataFrame(
        {
            "block": np.array(reuse_block, dtype=np.int64),
            "distance": np.array(reuse_dist, dtype=np.int64),
            "time_s": np.array(reuse_time, dtype=float),
        }
    )
    popularity = pd.DataFrame(
        {
            "block": np.fromiter(counts.keys(), np.int64, len(counts)),
            "accesses": np.fromiter(counts.values(), np.int64, len(counts)),
        }
    )
    popularity = popularity.sort_values(
        ["accesses", "block"], ascending=[False, True], kind="stable"
    ).reset_index(drop=True)

    arrivals_s = requests["arrival_s"].to_numpy(dtype=float)
    t0 = float(arrivals_s.min()) if len(arrivals_s) else 0.0
    duration = float(arrivals_s.max()) - t0 if len(arrivals_s) else 0.0
    width = _check_bin(bin_s, duration) if bin_s is not None else _auto_bin(duration)
    nbins = int(duration // width) + 1 if len(arrivals_s) else 0
    idx = (
        ((arrivals_s - t0) // width).astype(np.int64) if len(arrivals_s) else np.zeros(0, np.int64)
    )
    per_bin = np.bincount(idx, minlength=nbins)
    # the last bin ends at the last arrival: its width is what the trace covers of it
    widths = np.full(nbins, width, dtype=float)
    if nbins:
        widths[-1] = duration - width * (nbins - 1)
    arrivals = pd.DataFrame(
        {
            "start_s": t0 + width * np.arange(nbins),
            "requests": per_bin,
            "rate_rps": per_bin / width,
            "width_s": widths,
        }
    )

    n_blocks = int(requests["blocks"].sum())
    n_hits = int(requests["hit_blocks"].sum())
    n_reuses = len(reuses)
    reuse_per_block = popularity["accesses"].to_numpy() - 1

    def top_share(frac: float) -> float:
        if n_reuses == 0:
            return 0.0
        k = max(1, math.ceil(frac * len(popularity)))
        return float(np.sort(reuse_per_block)[::-1][:k].sum() / n_reuses)

    dist = pd.DataFrame(
        [
            _describe("prompt_tokens", requests["prompt_tokens"].to_numpy(), "tokens"),
            _describe("output_tokens", requests["output_tokens"].to_numpy(), "tokens"),
            _describe("prompt_blocks", requests["blocks"].to_numpy(), "blocks"),
            _describe("reuse_distance", reuses["distance"].to_numpy(), "blocks"),
            _describe("reuse_time", reuses["time_s"].to_numpy(), "s"),
        ]
        + (
            [_describe("reuse_lru_size", _lru_gib(reuses["distance"].to_numpy(), row), "GiB")]
            if row is not None
            else []
        )
    )
    d = dist.set_index("quantity")
    summary: dict[str, Any] = {
        "trace": str(tr.path),
        "requests": len(requests),
        "block_tokens": bt,
        "duration_s": duration,
        "mean_rate_rps": (len(requests) - 1) / duration if duration > 0 else math.nan,
        "prompt_tokens": int(requests["prompt_tokens"].sum()),
        "prompt_tokens_mean": d.at["prompt_tokens", "mean"],
        "prompt_tokens_p50": d.at["prompt_tokens", "p50"],
        "prompt_tokens_p99": d.at["prompt_tokens", "p99"],
        "output_tokens": int(requests["output_tokens"].sum()),
        "output_tokens_mean": d.at["output_tokens", "mean"],
        "output_tokens_p50": d.at["output_tokens", "p50"],
        "output_tokens_p99": d.at["output_tokens", "p99"],
        "blocks": n_blocks,
        "unique_blocks": len(popularity),
        "infinite_cache_hit_blocks": n_hits,
        "infinite_cache_hit_ratio": n_hits / n_blocks if n_blocks else 0.0,
        "reuses": n_reuses,
        "reuse_distance_p50": d.at["reuse_distance", "p50"],
        "reuse_distance_p90": d.at["reuse_distance", "p90"],
        **(_gib_summary(d, model, kv_cache_dtype, row, len(popularity)) if row else {}),
        "reuse_time_p50_s": d.at["reuse_time", "p50"],
        "reuse_time_p90_s": d.at["reuse_time", "p90"],
        "reuse_share_top1pct": top_share(0.01),
        "reuse_share_top10pct": top_share(0.10),
        "arrival_bin_s": width,
        "peak_rate_rps": float(arrivals["rate_rps"].max()) if nbins else 0.0,
    }
    tables = {
        "requests": requests,
        "reuses": reuses,
        "popularity": popularity,
        "arrivals": arrivals,
        "distributions": dist,
    }
    return Result(summary=summary, tables=tables, config={"block_tokens": bt, "limit": limit})


def _block_row_bytes(
    block_tokens: int, model: str | None, tp: int, kv_cache_dtype: str, gpu_block_tokens: int
) -> int | None:
    """Host bytes of one trace block as a CPU chunk, sized as the replay sizes it (None
    without a model)."""
    if model is None:
        return None
    from kvsim.options.offload import OffloadOptions
    from kvsim.specs.sizing import row_bytes

    config = OffloadOptions(
        cpu_chunks=1,
        model=model,
        tp=tp,
        kv_cache_dtype=kv_cache_dtype,
        block_tokens=block_tokens,
        gpu_block_tokens=gpu_block_tokens,
    ).resolve(block_tokens)
    assert config.chunk_bytes is not None  # a model was given
    return row_bytes(config.chunk_bytes)


def _lru_gib(distances: np.ndarray, row: int) -> np.ndarray:
    """GiB of an LRU tier that keeps reuses at these distances: ``distance + 1`` chunks."""
    gib: np.ndarray = (distances.astype(float) + 1.0) * row / GIB
    return gib


def _gib_summary(
    d: pd.DataFrame, model: str | None, kv_cache_dtype: str, row: int, unique_blocks: int
) -> dict[str, Any]:
    return {
        "model": model,
        "kv_cache_dtype": kv_cache_dtype,
        "block_bytes": row,
        **{
            f"reuse_distance_p{q}_gib": float(d.at["reuse_lru_size", f"p{q}"]) for q in (50, 90, 99)
        },
        "unique_blocks_gib": unique_blocks * row / GIB,
    }
