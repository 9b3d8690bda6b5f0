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
reported in the README. It grows as a miniature gets small: policies with fixed-share
queues (S3-FIFO's 10 % small queue, W-TinyLFU's 1 % window) or a power-of-two frequency
sketch do not shrink in proportion, SIEVE's hand sweeps a few dozen chunks, and few sampled
keys make any estimate noisy. So a capacity whose miniature would hold fewer than
``min_chunks`` chunks is replayed at a higher rate (:func:`point_rate`; the rate of every
point is in the table), and the default grid starts at ``min_chunks`` chunks (smaller
capacities would be full replays) with few points where the rate is raised. ``seeds``
averages independently seeded miniatures.
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
from kvsim.replay.mrc import MRC, key_scorer, lru_mrc, rate_threshold
from kvsim.replay.object_protocol import PROTOCOLS, replay_config
from kvsim.traces.model import Request

#: the fewest chunks a miniature may hold: a capacity whose miniature at the asked rate would
#: be smaller is replayed at a higher rate (:func:`point_rate`). Chosen by measurement (README,
#: "Curves for any policy"): below a few hundred chunks policies with small fixed-share queues
#: or a power-of-two frequency sketch (S3-FIFO, W-TinyLFU) and SIEVE's hand drift from their
#: full-size selves, and few sampled keys make the estimate noisy.
MIN_CHUNKS = 512

#: the fewest distinct keys a sample should hold: on a trace with fewer than
#: ``MIN_KEYS / rate`` distinct chunk keys every capacity is sampled at ``MIN_KEYS /
#: distinct`` instead. With a few thousand sampled keys, which keys fell in the sample
#: decides the estimate (SHARDS' fixed-size variant sizes its sample in keys for the same
#: reason); the value is chosen by measurement on the bundled synthetic trace.
MIN_KEYS = 8192


def base_rate(rate: float, distinct: int, min_keys: int = MIN_KEYS) -> float:
    """``rate``, raised on a small trace until the sample holds about ``min_keys`` of its
    ``distinct`` chunk keys (at most 1)."""
    if distinct <= 0:
        return float(rate)
    return float(min(1.0, max(rate, min_keys / distinct)))


def point_rate(capacity: int, rate: float, min_chunks: int = MIN_CHUNKS) -> float:
    """The sampling rate ``capacity`` is replayed at: ``rate``, doubled until the miniature
    holds ``min_chunks`` chunks, at most 1 (a full replay, exact). Doubling keeps the rates
    few, so capacities share sampled traces, and the hash filter nests: a key sampled at
    ``rate`` is sampled at every rate above it."""
    r = float(rate)
    while r < 1.0 and capacity * r < min_chunks:
        r = min(1.0, 2.0 * r)
    return r


class _Sampler:
    """A trace's chunk keys, listed and scored once, sampled at any rate (one seed)."""

    def __init__(self, requests: Iterable[Request], config: CacheConfig, seed: int) -> None:
        layout = config.layout
        self.chunk_tokens = config.chunk_tokens
        self.keyed: list[tuple[Request, list[ChunkKey]]] = []
        score = key_scorer(seed)
        self.score: dict[ChunkKey, int] = {}
        units = accesses = 0
        for req in requests:
            unit_keys = layout.unit_keys(req.block_hashes, req.input_tokens)
            keys: list[ChunkKey] = layout.chunk_keys(unit_keys)
            units += len(unit_keys)
            accesses += len(keys)
            for k in keys:
                if k not in self.score:
                    self.score[k] = score(k)
            self.keyed.append((req, keys))
        self.counts = {"accesses": accesses, "prompt_units": units, "distinct": len(self.score)}
        self._cache: dict[float, tuple[list[Request], int]] = {}

    def sample(self, rate: float) -> tuple[list[Request], int]:
        """The sampled trace at ``rate`` (one request per request, holding its sampled chunk
        keys as whole one-chunk blocks, in prompt order) and its number of chunk accesses."""
        if rate in self._cache:
            return self._cache[rate]
        tpc = self.chunk_tokens
        threshold = rate_threshold(rate) if rate < 1.0 else None
        score = self.score
        out: list[Request] = []
        sampled = 0
        for req, keys in self.keyed:
            if threshold is not None:
                keys = [k for k in keys if score[k] < threshold]
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
        self._cache[rate] = (out, sampled)
        return out, sampled


def sample_requests(
    requests: Iterable[Request], config: CacheConfig, rate: float, seed: int
) -> tuple[list[Request], dict[str, int]]:
    """The sampled trace (one request per request, holding its sampled chunk keys as whole
    one-chunk blocks) and the counts needed to scale ratios back to prompt units."""
    sampler = _Sampler(requests, config, seed)
    out, sampled = sampler.sample(rate)
    return out, {**sampler.counts, "sampled": sampled}


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


def _exact_lru(
    requests: list[Request], config: CacheConfig, capacities: Sequence[int], protocol: str
) -> list[float]:
    """LRU's exact full-size hit ratios: the one-pass stack for the object protocol, else
    full replays of the fused tier (fast)."""
    lru = replace(config, policy="lru", policy_module=None)
    if protocol == "object" and lru.admission == "always":
        curve = lru_mrc(requests, config.layout, protocol="object", capacities=capacities)
        return [curve.hit_ratio(c) for c in capacities]
    return [replay_hit_ratio(requests, replace(lru, num_chunks=c), protocol) for c in capacities]


def _one_seed(
    sampler: _Sampler,
    config: CacheConfig,
    grid: Sequence[int],
    rates: Sequence[float],
    protocol: str,
    scale: float,
    exact: list[float] | None,
    progress: Callable[[int], object] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One seed's estimates at each capacity: (corrected, uncorrected).

    The correction is LRU, the control variate: its exact full-size ratio minus its
    miniature's on the same sample. The difference is the sample's own error, which every
    policy's miniature shares in the main: the keys that happened to be sampled (a trace's
    hottest prefix blocks are few, so whether they fall in the sample moves every policy's
    estimate alike). A point at rate 1 is a full replay and needs none."""
    lru = replace(config, policy="lru", policy_module=None)
    raw, hits = [], []
    for i, (capacity, rate) in enumerate(zip(grid, rates)):
        sampled, _ = sampler.sample(rate)
        estimate = replay_hit_ratio(sampled, miniature_config(config, capacity, rate), protocol)
        raw.append(estimate * scale)
        if exact is not None and rate < 1.0:
            lru_mini = replay_hit_ratio(sampled, miniature_config(lru, capacity, rate), protocol)
            hits.append(min(1.0, max(0.0, (estimate - lru_mini) * scale + exact[i])))
        else:
            hits.append(estimate * scale)
        if progress is not None:
            progress(1)
    return np.asarray(hits), np.asarray(raw)


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
    min_chunks: int = MIN_CHUNKS,
    min_keys: int = MIN_KEYS,
    seeds: int = 1,
    progress: Callable[[int], object] | None = None,
) -> MRC:
    """The hit-ratio curve of ``config``'s policy at each capacity (in full-size chunks;
    default: ``points`` of :func:`miniature_grid` and the ``extra`` ones).

    Each capacity is replayed at :func:`point_rate` (``sample_rate``, raised to
    :func:`base_rate` on a trace of fewer than ``min_keys / sample_rate`` distinct keys,
    then until its miniature holds ``min_chunks`` chunks; the table's ``sample_rate``
    column). With ``control`` (the default) each estimate is corrected by LRU's error on
    the same sample; the table keeps the uncorrected estimate beside it. ``seeds`` > 1
    averages that many independently seeded miniatures (``seed``, ``seed + 1``, ...), each
    corrected by its own control: the sampling variance falls as 1 / seeds, the work grows
    as seeds (a bias shared by every seed stays).
    """
    _check(config, sample_rate, protocol)
    if capacities is not None and (not capacities or min(capacities) < 1):
        raise InputError("capacities must be a non-empty list of positive chunk counts")
    if min_chunks < 0:
        raise InputError(f"--min-chunks must be at least 0, got {min_chunks}")
    if seeds < 1:
        raise InputError(f"--seeds must be at least 1, got {seeds}")
    if min_keys < 0:
        raise InputError(f"--min-keys must be at least 0, got {min_keys}")
    reqs = list(requests)
    samplers = [_Sampler(reqs, config, seed + i) for i in range(seeds)]
    counts = samplers[0].counts
    base_sampled = samplers[0].sample(sample_rate)[1]
    if counts["accesses"] and not base_sampled:
        raise InputError(
            f"--sample-rate {sample_rate} kept none of the trace's {counts['accesses']:,} "
            "chunk accesses; use a larger rate"
        )
    # prefix protocol: the replay reports hits per prompt unit; a chunk holds upc units
    scale = 1.0
    if protocol == "prefix" and counts["prompt_units"]:
        scale = counts["accesses"] * config.layout.units_per_chunk / counts["prompt_units"]
    least = base_rate(sample_rate, counts["distinct"], min_keys)
    grid = (
        miniature_grid(counts["distinct"], least, points, extra, min_chunks)
        if capacities is None
        else sorted(set(int(c) for c in capacities))
    )
    rates = [point_rate(c, least, min_chunks) for c in grid]
    corrected = control and any(r < 1.0 for r in rates)
    exact = _exact_lru(reqs, config, grid, protocol) if corrected else None
    runs = [_one_seed(s, config, grid, rates, protocol, scale, exact, progress) for s in samplers]
    hits = np.mean([h for h, _ in runs], axis=0)
    raw = np.mean([r for _, r in runs], axis=0)
    table = pd.DataFrame(
        {
            "capacity": grid,
            "hit_ratio": hits,
            "miss_ratio": 1.0 - hits,
            "uncorrected": raw,
            "sample_rate": rates,
            "miniature_chunks": [max(1, round(c * r)) for c, r in zip(grid, rates)],
        }
    )
    info: dict[str, Any] = {
        "method": "miniature",
        "control": bool(corrected),
        "policy": config.policy,
        "prompt_units": counts["prompt_units"],
        "min_chunks": min_chunks,
        "min_keys": min_keys,
        "base_rate": least,
        "seeds": seeds,
        "rates": sorted(set(rates)),
    }
    return MRC(table, protocol, sample_rate, counts["accesses"], base_sampled, 1, info)


def miniature_grid(
    distinct: int,
    rate: float,
    points: int,
    extra: Sequence[int] = (),
    min_chunks: int = MIN_CHUNKS,
) -> list[int]:
    """Capacities to one past the trace's distinct chunks (every reuse hits there), plus
    ``extra``: geometric from where a miniature at ``rate`` holds ``min_chunks`` chunks (or,
    with the rule off, one chunk). Below that, one capacity per rate of the
    :func:`point_rate` ladder (each the smallest replayed at its rate, down to
    ``min_chunks`` itself, a full replay): points there cost up to a full replay each, so
    they are few."""
    top = max(1, distinct + 1)
    knees: set[int] = set()
    low = max(1, int(np.ceil(1.0 / rate)))
    if rate < 1.0 and min_chunks > 0:
        r = rate
        while r < 1.0:
            knees.add(int(np.ceil(min_chunks / r)))
            r = min(1.0, 2.0 * r)
        knees.add(min_chunks)
        low = max(low, max(knees))
    low = min(low, top)
    knees = {c for c in knees if c < low}
    geo = np.geomspace(low, top, num=max(2, points - len(knees))).astype(int)
    return sorted(knees | set(np.unique(geo).tolist()) | {int(c) for c in extra})


def miniature_error(
    requests: Sequence[Request],
    config: CacheConfig,
    capacities: Sequence[int],
    *,
    sample_rate: float = 0.1,
    seed: int = 0,
    protocol: str = "prefix",
    control: bool = True,
    min_chunks: int = MIN_CHUNKS,
    min_keys: int = MIN_KEYS,
    seeds: int = 1,
) -> pd.DataFrame:
    """Miniature vs full replay at each capacity: columns capacity, sample_rate (the point's,
    :func:`point_rate`), miniature, full, error."""
    reqs = list(requests)
    curve = miniature_mrc(
        reqs,
        config,
        capacities,
        sample_rate=sample_rate,
        seed=seed,
        protocol=protocol,
        control=control,
        min_chunks=min_chunks,
        min_keys=min_keys,
        seeds=seeds,
    )
    rows = []
    for capacity, rate, estimate in zip(
        curve.table["capacity"], curve.table["sample_rate"], curve.table["hit_ratio"]
    ):
        exact = replay_hit_ratio(reqs, replace(config, num_chunks=int(capacity)), protocol)
        rows.append((int(capacity), float(rate), float(estimate), exact, float(estimate) - exact))
    return pd.DataFrame(rows, columns=["capacity", "sample_rate", "miniature", "full", "error"])


#: the shares of a trace's distinct chunks ``kvsim bench --miniature-error`` measures at
ERROR_FRACTIONS = (0.01, 0.03, 0.1, 0.3, 1.0)


def error_capacities(distinct: int) -> list[int]:
    """The capacities of the error table: :data:`ERROR_FRACTIONS` of ``distinct``."""
    return sorted({max(1, int(distinct * f)) for f in ERROR_FRACTIONS})


def error_table(
    trace: str,
    policies: Sequence[str],
    rate: float,
    limit: int | None = None,
    *,
    min_chunks: int = MIN_CHUNKS,
    min_keys: int = MIN_KEYS,
    seeds: int = 1,
) -> pd.DataFrame:
    """Each policy's largest miniature error (both protocols) at 1, 3, 10, 30 and 100% of
    the trace's distinct chunks: what ``kvsim bench --miniature-error`` prints, with the
    rate the worst point was replayed at (``rate_at_max``) and every point's (``rates``)."""
    from kvsim.config import OffloadOptions
    from kvsim.traces import as_trace

    tr = as_trace(trace, limit=limit)
    requests = list(tr)
    base = OffloadOptions(cpu_chunks=1).resolve(tr.block_tokens)
    distinct = len(
        {k for r in requests for k in base.layout.unit_keys(r.block_hashes, r.input_tokens)}
    )
    capacities = error_capacities(distinct)
    rows = []
    for policy in policies:
        config = replace(base, policy=policy)
        for protocol in PROTOCOLS:
            err = miniature_error(
                requests,
                config,
                capacities,
                sample_rate=rate,
                protocol=protocol,
                min_chunks=min_chunks,
                min_keys=min_keys,
                seeds=seeds,
            )
            worst = err.loc[err["error"].abs().idxmax()]
            rows.append(
                {
                    "policy": policy,
                    "protocol": protocol,
                    "max_abs_error": abs(float(worst["error"])),
                    "at_capacity": int(worst["capacity"]),
                    "rate_at_max": float(worst["sample_rate"]),
                    "mean_abs_error": float(err["error"].abs().mean()),
                    "rates": "/".join(f"{r:g}" for r in err["sample_rate"]),
                }
            )
    table = pd.DataFrame(rows)
    least = base_rate(rate, distinct, min_keys)
    rates = [point_rate(c, least, min_chunks) for c in capacities]
    table.attrs = {
        "base_rate": least,
        "capacities": capacities,
        "rates": rates,
        "miniature_chunks": [max(1, round(c * r)) for c, r in zip(capacities, rates)],
    }
    return table
