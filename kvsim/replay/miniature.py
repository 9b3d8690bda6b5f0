"""Hit-ratio curves for any policy by miniature simulation (Waldspurger et al., ATC'17).

Only LRU has a stack, so only LRU gets a one-pass curve (:mod:`kvsim.replay.mrc`). Any
other policy is replayed, but on a miniature: the trace is sampled spatially (a chunk key
is kept iff its salted hash falls below the rate, the SHARDS filter, so a key is either
always or never in the sample) and each capacity ``C`` is simulated as a cache of
``round(C * rate)`` chunks fed only the sampled keys. The ratio of sampled hits to sampled
accesses estimates the full trace's, at about ``rate`` of the work per capacity.

Each sampled request keeps its sampled chunks in prompt order, as whole chunks, so the
prefix protocol still hits the longest resident prefix of what was sampled. The
miniatures run without a GPU tier and without chunked prefill (both are per-request
positional and have no sampled counterpart): ask for them and this module says no. The
admission tracker (``max_tracker_size``) shrinks with the rate like the cache.
The estimate's error is measured against full replays by :func:`miniature_error` and
reported in the README; it grows as ``C * rate`` gets small (a few chunks), so the table
starts at the capacity whose miniature holds ``min_chunks`` chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from kvsim.config import CacheConfig
from kvsim.errors import InputError
from kvsim.keys import ChunkKey
from kvsim.replay.driver import CacheReplay
from kvsim.replay.mrc import MRC, key_sampler, lru_mrc
from kvsim.replay.object_protocol import PROTOCOLS, replay_config
from kvsim.traces.model import Request


def sample_requests(
    requests: Iterable[Request], config: CacheConfig, rate: float, seed: int
) -> tuple[list[Request], dict[str, int]]:
    """The sampled trace (one request per request, holding its sampled chunk keys as whole
    one-chunk blocks) and the counts needed to scale ratios back to prompt units."""
    keep = key_sampler(rate, seed)
    layout = config.layout
    tpc = config.chunk_tokens
    out: list[Request] = []
    accesses = sampled = units = 0
    distinct: set[ChunkKey] = set()
    for req in requests:
        unit_keys = layout.unit_keys(req.block_hashes, req.input_tokens)
        keys: list[ChunkKey] = layout.chunk_keys(unit_keys)
        units += len(unit_keys)
        accesses += len(keys)
        distinct.update(keys)
        if keep is not None:
            keys = [k for k in keys if keep(k)]
        sampled += len(keys)
        out.append(
            Request(
                req.request_id,
                req.arrival_s,
                len(keys) * tpc,
                req.output_tokens,
                tuple(keys),
                req.session_id,
            )
        )
    counts = {
        "accesses": accesses,
        "sampled": sampled,
        "prompt_units": units,
        "distinct": len(distinct),
    }
    return out, counts


def miniature_config(config: CacheConfig, capacity: int, rate: float) -> CacheConfig:
    """``config`` shrunk to a miniature of ``capacity`` full-size chunks at ``rate``."""
    return replace(
        config,
        num_chunks=max(1, round(capacity * rate)),
        block_tokens=config.chunk_tokens,
        gpu_blocks=0,
        prefill_chunk_tokens=None,
        max_tracker_size=max(1, round(config.max_tracker_size * rate)),
        chunk_bytes=None,
    )


def _check(config: CacheConfig, rate: float, protocol: str) -> None:
    if not 0.0 < rate <= 1.0:
        raise InputError(f"--sample-rate must be in (0, 1], got {rate}")
    if protocol not in PROTOCOLS:
        raise InputError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if config.gpu_blocks:
        raise InputError(
            "a miniature-simulation curve models the CPU tier alone; drop --gpu-blocks"
        )
    if config.prefill_chunk_tokens:
        raise InputError(
            "a miniature-simulation curve cannot model chunked prefill; drop prefill_chunk_tokens"
        )


def replay_hit_ratio(requests: list[Request], config: CacheConfig, protocol: str) -> float:
    """The hit ratio of one replay: a miniature's (sampled hits per sampled access) or a
    full-size one's (the miniature's reference)."""
    if protocol == "object":
        return float(replay_config(requests, config, "object")["hit_ratio"])
    return float(CacheReplay(config, requests_for_future=requests).run(requests)["cpu_hit_ratio"])


def _control_ratios(
    requests: list[Request],
    sampled: list[Request],
    config: CacheConfig,
    capacities: Sequence[int],
    rate: float,
    protocol: str,
) -> tuple[list[float], list[float]]:
    """LRU, the control variate: its exact full-size hit ratios (the fused tier, or the
    one-pass stack for the object protocol, both exact) and its miniatures' on the same
    sample. The difference is the sample's own error, which every policy's miniature shares
    in the main: the keys that happened to be sampled (a trace's hottest prefix blocks are
    few, so whether they fall in the sample moves every policy's estimate alike)."""
    lru = replace(config, policy="lru", policy_module=None)
    if protocol == "object" and lru.admission == "always":
        curve = lru_mrc(requests, config.layout, protocol="object", capacities=capacities)
        exact = [curve.hit_ratio(c) for c in capacities]
    else:
        exact = [
            replay_hit_ratio(requests, replace(lru, num_chunks=c), protocol) for c in capacities
        ]
    mini = [replay_hit_ratio(sampled, miniature_config(lru, c, rate), protocol) for c in capacities]
    return exact, mini


def miniature_mrc(
    requests: Iterable[Request],
    config: CacheConfig,
    capacities: Sequence[int] | None = None,
    *,
    sample_rate: float = 0.1,
    seed: int = 0,
    protocol: str = "prefix",
    control: bool = True,
    points: int = 24,
    extra: Sequence[int] = (),
    progress: Callable[[int], object] | None = None,
) -> MRC:
    """The hit-ratio curve of ``config``'s policy at each capacity (in full-size chunks;
    default: ``points`` of :func:`miniature_grid` and the ``extra`` ones).

    With ``control`` (the default) each estimate is corrected by LRU's error on the same
    sample (:func:`_control_ratios`); the table keeps the uncorrected estimate beside it.
    """
    _check(config, sample_rate, protocol)
    if capacities is not None and (not capacities or min(capacities) < 1):
        raise InputError("capacities must be a non-empty list of positive chunk counts")
    reqs = list(requests)
    sampled, counts = sample_requests(reqs, config, sample_rate, seed)
    if counts["accesses"] and not counts["sampled"]:
        raise InputError(
            f"--sample-rate {sample_rate} kept none of the trace's {counts['accesses']:,} "
            "chunk accesses; use a larger rate"
        )
    # prefix protocol: the replay reports hits per prompt unit; a chunk holds upc units
    scale = 1.0
    if protocol == "prefix" and counts["prompt_units"]:
        scale = counts["accesses"] * config.layout.units_per_chunk / counts["prompt_units"]
    grid = (
        miniature_grid(counts["distinct"], sample_rate, points, extra)
        if capacities is None
        else sorted(set(int(c) for c in capacities))
    )
    raw = []
    for capacity in grid:
        mini = miniature_config(config, capacity, sample_rate)
        raw.append(replay_hit_ratio(sampled, mini, protocol) * scale)
        if progress is not None:
            progress(1)
    hits = np.asarray(raw)
    if control and sample_rate < 1.0:
        exact, lru_mini = _control_ratios(reqs, sampled, config, grid, sample_rate, protocol)
        hits = np.clip(hits + np.asarray(exact) - np.asarray(lru_mini) * scale, 0.0, 1.0)
    table = pd.DataFrame(
        {"capacity": grid, "hit_ratio": hits, "miss_ratio": 1.0 - hits, "uncorrected": raw}
    )
    info: dict[str, Any] = {
        "method": "miniature",
        "control": bool(control and sample_rate < 1.0),
        "policy": config.policy,
        "prompt_units": counts["prompt_units"],
        "miniature_chunks": [max(1, round(c * sample_rate)) for c in grid],
    }
    return MRC(table, protocol, sample_rate, counts["accesses"], counts["sampled"], 1, info)


def miniature_grid(distinct: int, rate: float, points: int, extra: Sequence[int] = ()) -> list[int]:
    """Geometric capacities from the smallest whose miniature holds a chunk to one past the
    trace's distinct chunks (every reuse hits there), plus ``extra``."""
    low = max(1, int(np.ceil(1.0 / rate)))
    top = max(low, distinct + 1)
    grid = np.unique(np.geomspace(low, top, num=max(2, points)).astype(int))
    return sorted(set(grid.tolist()) | {int(c) for c in extra})


def miniature_error(
    requests: Sequence[Request],
    config: CacheConfig,
    capacities: Sequence[int],
    *,
    sample_rate: float = 0.1,
    seed: int = 0,
    protocol: str = "prefix",
    control: bool = True,
) -> pd.DataFrame:
    """Miniature vs full replay at each capacity: columns capacity, miniature, full, error."""
    reqs = list(requests)
    curve = miniature_mrc(
        reqs,
        config,
        capacities,
        sample_rate=sample_rate,
        seed=seed,
        protocol=protocol,
        control=control,
    )
    rows = []
    for capacity, estimate in zip(curve.table["capacity"], curve.table["hit_ratio"]):
        exact = replay_hit_ratio(reqs, replace(config, num_chunks=int(capacity)), protocol)
        rows.append((int(capacity), float(estimate), exact, float(estimate) - exact))
    return pd.DataFrame(rows, columns=["capacity", "miniature", "full", "error"])


def error_table(
    trace: str, policies: Sequence[str], rate: float, limit: int | None = None
) -> pd.DataFrame:
    """Each policy's largest miniature error (both protocols) at 1, 3, 10, 30 and 100% of
    the trace's distinct chunks: what ``kvsim bench --miniature-error`` prints."""
    from kvsim.config import OffloadOptions
    from kvsim.traces import as_trace

    tr = as_trace(trace, limit=limit)
    requests = list(tr)
    base = OffloadOptions(cpu_chunks=1).resolve(tr.block_tokens)
    distinct = len(
        {k for r in requests for k in base.layout.unit_keys(r.block_hashes, r.input_tokens)}
    )
    capacities = sorted({max(1, int(distinct * f)) for f in (0.01, 0.03, 0.1, 0.3, 1.0)})
    rows = []
    for policy in policies:
        config = replace(base, policy=policy)
        for protocol in PROTOCOLS:
            err = miniature_error(requests, config, capacities, sample_rate=rate, protocol=protocol)
            worst = err.loc[err["error"].abs().idxmax()]
            rows.append(
                {
                    "policy": policy,
                    "protocol": protocol,
                    "max_abs_error": abs(float(worst["error"])),
                    "at_capacity": int(worst["capacity"]),
                    "mean_abs_error": float(err["error"].abs().mean()),
                }
            )
    return pd.DataFrame(rows)
