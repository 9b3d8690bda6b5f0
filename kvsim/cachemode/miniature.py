"""Hit-ratio curves for any policy by miniature simulation (Waldspurger et al., ATC'17).

Only LRU has a stack, so only LRU gets a one-pass curve (:mod:`kvsim.cachemode.mrc`). Any
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
reported in docs/cache-mode.md. It grows as a miniature gets small: policies with fixed-share
queues (S3-FIFO's 10 % small queue, W-TinyLFU's 1 % window) or a power-of-two frequency
sketch do not shrink in proportion, SIEVE's hand sweeps a few dozen chunks, and few sampled
keys make any estimate noisy. So a capacity whose miniature would hold fewer than
``min_chunks`` chunks is replayed at a higher rate (:func:`point_rate`; the rate of every
point is in the table), and the default grid starts at ``min_chunks`` chunks (smaller
capacities would be full replays) with few points where the rate is raised. ``seeds``
averages independently seeded miniatures.

A key so hot that sampling it or not would alone move the estimate (a block that starts
every request) is taken whole instead (a take-all stratum, :func:`forced_keys`): it is in
every miniature at every seed, its hits and accesses count ``rate`` each (a sampled key
stands for ``1 / rate`` keys, a forced one only for itself), and the miniature gets
``1 - rate`` of a slot more per forced key, the room it takes in the full-size cache.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from kvsim.cachemode.driver import CacheReplay
from kvsim.cachemode.mrc import MRC, key_scorer, lru_mrc, rate_threshold
from kvsim.cachemode.object_protocol import PROTOCOLS, replay_config
from kvsim.core.errors import InputError
from kvsim.core.keys import ChunkKey
from kvsim.options.config import CacheConfig
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

#: a chunk key is forced into every miniature (:func:`forced_keys`) when its accesses scaled
#: by ``1 / rate`` (what it would weigh if sampled) are at least this share of the trace's
#: accesses: sampling it or not would alone move the estimated access count by that much.
#: Bounds the forced keys at ``1 / (rate * HEAVY_SHARE)`` (1,000 at 10 %); fixed from the
#: 0.01 error goal, not fitted to a trace. 0 turns forcing off.
HEAVY_SHARE = 0.01


def base_rate(rate: float, distinct: int, min_keys: int = MIN_KEYS) -> float:
    """``rate``, raised on a small trace until the sample holds about ``min_keys`` of its
    ``distinct`` chunk keys (at most 1)."""
    if distinct <= 0:
        return float(rate)
    return float(min(1.0, max(rate, min_keys / distinct)))


def forced_keys(
    counts: dict[ChunkKey, int], accesses: int, rate: float, share: float = HEAVY_SHARE
) -> frozenset[ChunkKey]:
    """The keys every miniature at ``rate`` keeps (none at rate 1 or ``share`` 0): those with
    ``count / rate >= share * accesses`` (:data:`HEAVY_SHARE`)."""
    if rate >= 1.0 or share <= 0.0 or not accesses:
        return frozenset()
    least = share * accesses * rate
    return frozenset(k for k, n in counts.items() if n >= least)


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

    def __init__(
        self,
        requests: Iterable[Request],
        config: CacheConfig,
        seed: int,
        heavy_share: float = HEAVY_SHARE,
    ) -> None:
        layout = config.layout
        self.chunk_tokens = config.chunk_tokens
        self.heavy_share = heavy_share
        self.keyed: list[tuple[Request, list[ChunkKey]]] = []
        score = key_scorer(seed)
        self.score: dict[ChunkKey, int] = {}
        self.uses: dict[ChunkKey, int] = {}
        uses = self.uses
        units = accesses = 0
        for req in requests:
            unit_keys = layout.unit_keys(req.block_hashes, req.input_tokens)
            keys: list[ChunkKey] = layout.chunk_keys(unit_keys)
            units += len(unit_keys)
            accesses += len(keys)
            for k in keys:
                n = uses.get(k)
                if n is None:
                    self.score[k] = score(k)
                    uses[k] = 1
                else:
                    uses[k] = n + 1
            self.keyed.append((req, keys))
        self.counts = {"accesses": accesses, "prompt_units": units, "distinct": len(self.score)}
        self._cache: dict[float, tuple[list[Request], int]] = {}
        self._forced: dict[float, frozenset[ChunkKey]] = {}

    def reseeded(self, seed: int) -> _Sampler:
        """The same trace under another seed: only the keys' scores (and so the samples)
        change; the keys, their counts and the forced keys are shared, not walked again."""
        other = copy.copy(self)
        score = key_scorer(seed)
        other.score = {k: score(k) for k in self.score}
        other._cache = {}
        return other

    def forced(self, rate: float) -> frozenset[ChunkKey]:
        """The keys every miniature at ``rate`` keeps whatever their hash
        (:func:`forced_keys`; the same at every seed)."""
        if rate not in self._forced:
            self._forced[rate] = forced_keys(
                self.uses, self.counts["accesses"], rate, self.heavy_share
            )
        return self._forced[rate]

    def sample(self, rate: float) -> tuple[list[Request], int]:
        """The sampled trace at ``rate`` (one request per request, holding its sampled chunk
        keys as whole one-chunk blocks, in prompt order) and its number of chunk accesses."""
        if rate in self._cache:
            return self._cache[rate]
        tpc = self.chunk_tokens
        threshold = rate_threshold(rate) if rate < 1.0 else None
        score = self.score
        forced = self.forced(rate)
        out: list[Request] = []
        sampled = 0
        for req, keys in self.keyed:
            if threshold is not None:
                keys = [k for k in keys if score[k] < threshold or k in forced]
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


def miniature_config(
    config: CacheConfig, capacity: int, rate: float, forced: int = 0
) -> CacheConfig:
    """``config`` shrunk to a miniature of ``capacity`` full-size chunks at ``rate``, with
    ``1 - rate`` of a slot more for each of ``forced`` keys (at most ``capacity``): a forced
    key takes one slot of the full-size cache and one of the miniature, not ``rate``."""
    return replace(
        config,
        num_chunks=max(1, round(capacity * rate + (1.0 - rate) * min(forced, capacity))),
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


def weighted_hit_ratio(
    requests: list[Request],
    config: CacheConfig,
    protocol: str,
    forced: frozenset[ChunkKey],
    rate: float,
) -> float:
    """A miniature's hit ratio with each access of a ``forced`` key counting ``rate`` (its
    hits likewise): a sampled key stands for ``1 / rate`` keys, a forced one for itself.
    Without forced keys, :func:`replay_hit_ratio`."""
    if not forced or rate >= 1.0:
        return replay_hit_ratio(requests, config, protocol)
    if protocol == "object":
        hits, accesses, f_hits, f_accesses = _object_counts(requests, config, forced)
    else:
        hits, accesses, f_hits, f_accesses = _prefix_counts(requests, config, forced)
    denominator = accesses - (1.0 - rate) * f_accesses
    if denominator <= 0:
        return 0.0
    return (hits - (1.0 - rate) * f_hits) / denominator


def _prefix_counts(
    requests: list[Request], config: CacheConfig, forced: frozenset[ChunkKey]
) -> tuple[int, int, int, int]:
    """Chunk hits and accesses of a prefix-protocol miniature, all and of forced keys: a
    request hits a prefix, so a forced key hits iff its position is inside it."""
    positions = [[i for i, k in enumerate(r.block_hashes) if k in forced] for r in requests]
    f_hits = 0
    row = iter(positions)

    def count(r: tuple[Any, ...]) -> None:
        nonlocal f_hits
        mine = next(row)
        if mine:
            hit = r[5]  # a miniature chunk is one unit: the request's hit chunks
            f_hits += sum(1 for i in mine if i < hit)

    summary = CacheReplay(config, requests_for_future=requests).run(requests, count)
    f_accesses = sum(len(p) for p in positions)
    return summary["cpu_hit_blocks"], summary["prompt_blocks"], f_hits, f_accesses


def _object_counts(
    requests: list[Request], config: CacheConfig, forced: frozenset[ChunkKey]
) -> tuple[int, int, int, int]:
    """Hits and accesses of an object-protocol miniature, all and of forced keys: the
    stream runs in pieces split at forced keys (the cache carries its state and clock
    across pieces, so the decisions are those of one run). The cache is the one
    :func:`replay_config` builds, so without forced keys both give the same hits."""
    from kvsim.cachemode.object_protocol import block_stream, object_cache

    cache = object_cache(config)
    stream = list(block_stream(requests, config.layout))
    cache.prepare(stream)
    f_hits = f_accesses = 0
    start = 0
    for i, key in enumerate(stream):
        if key in forced:
            if start < i:
                cache.run(stream[start:i])
            before = cache.stats.hits
            cache.run((key,))
            f_hits += cache.stats.hits - before
            f_accesses += 1
            start = i + 1
    if start < len(stream):
        cache.run(stream[start:])
    return cache.stats.hits, cache.stats.accesses, f_hits, f_accesses


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
        forced = sampler.forced(rate)
        n = len(forced)
        mini = miniature_config(config, capacity, rate, n)
        estimate = weighted_hit_ratio(sampled, mini, protocol, forced, rate)
        raw.append(estimate * scale)
        if exact is not None and rate < 1.0:
            mini = miniature_config(lru, capacity, rate, n)
            lru_mini = weighted_hit_ratio(sampled, mini, protocol, forced, rate)
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
    heavy_share: float = HEAVY_SHARE,
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
    as seeds (a bias shared by every seed stays). Keys with ``heavy_share`` of the accesses
    once scaled by ``1 / rate`` are in every miniature (:func:`forced_keys`; the table's
    ``forced_keys`` column; 0 = never).
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
    if heavy_share < 0:
        raise InputError(f"--heavy-share must be at least 0, got {heavy_share}")
    reqs = list(requests)
    first = _Sampler(reqs, config, seed, heavy_share)
    samplers = [first, *(first.reseeded(seed + i) for i in range(1, seeds))]
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
    forced = [len(samplers[0].forced(r)) for r in rates]
    table = pd.DataFrame(
        {
            "capacity": grid,
            "hit_ratio": hits,
            "miss_ratio": 1.0 - hits,
            "uncorrected": raw,
            "sample_rate": rates,
            "miniature_chunks": [
                miniature_config(config, c, r, f).num_chunks for c, r, f in zip(grid, rates, forced)
            ],
            "forced_keys": forced,
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
        "heavy_share": heavy_share,
        "forced_keys": max(forced, default=0),
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
    heavy_share: float = HEAVY_SHARE,
) -> pd.DataFrame:
    """Miniature vs full replay at each capacity: columns capacity, sample_rate (the point's,
    :func:`point_rate`), forced_keys, miniature, full, error."""
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
        heavy_share=heavy_share,
    )
    rows = []
    t = curve.table
    for capacity, rate, forced, estimate in zip(
        t["capacity"], t["sample_rate"], t["forced_keys"], t["hit_ratio"]
    ):
        exact = replay_hit_ratio(reqs, replace(config, num_chunks=int(capacity)), protocol)
        est = float(estimate)
        rows.append((int(capacity), float(rate), int(forced), est, exact, est - exact))
    columns = ["capacity", "sample_rate", "forced_keys", "miniature", "full", "error"]
    return pd.DataFrame(rows, columns=columns)


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
    heavy_share: float = HEAVY_SHARE,
) -> pd.DataFrame:
    """Each policy's largest miniature error (both protocols) at 1, 3, 10, 30 and 100% of
    the trace's distinct chunks: what ``kvsim bench --miniature-error`` prints, with the
    rate the worst point was replayed at (``rate_at_max``) and every point's (``rates``)."""
    from kvsim.options.offload import OffloadOptions
    from kvsim.traces import as_trace

    tr = as_trace(trace, limit=limit)
    requests = list(tr)
    base = OffloadOptions(cpu_chunks=1).resolve(tr.block_tokens)
    distinct = len(
        {k for r in requests for k in base.layout.unit_keys(r.block_hashes, r.input_tokens)}
    )
    capacities = error_capacities(distinct)
    rows = []
    forced = [0] * len(capacities)  # keys forced into every miniature: the same for all
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
                heavy_share=heavy_share,
            )
            forced = [int(f) for f in err["forced_keys"]]
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
        "forced_keys": forced,
        "miniature_chunks": [
            miniature_config(base, c, r, f).num_chunks for c, r, f in zip(capacities, rates, forced)
        ],
    }
    return table
