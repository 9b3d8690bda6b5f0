"""Hit-ratio-vs-capacity curves for LRU in one pass (stack distances), with SHARDS sampling.

LRU has the inclusion property: after every access the resident set of a cache of C
chunks is the top C of one recency stack that does not depend on C. So one pass that
records each access's depth in the stack gives the hit ratio at every capacity.

* ``protocol="object"``: every chunk key is one access; a hit at capacity C iff its depth
  (1 + distinct keys used since its last use) is at most C. Exact for textbook LRU.
* ``protocol="prefix"`` (vLLM's LRU in cache mode, no GPU tier): a request's keys are
  looked up together at its start, and the CPU tier hits the longest prefix whose keys are
  all resident, so chunk j hits iff ``max(depth of chunks 0..j) <= C``; when the request
  finishes all its keys move to the top of the stack, head on top (vLLM commits ranks
  tail first). Exact for every capacity of at least the longest request in chunks
  (``exact_from``): below it vLLM's all-or-nothing store can fail, which a stack cannot
  express.

Depths come from a Fenwick tree over access timestamps (O(log N) per key).

SHARDS (Waldspurger et al., FAST'15), fixed rate: only keys whose hash falls below
``sample_rate`` are tracked; their depths are scaled by ``1 / sample_rate``, and the hit
ratio is the share of sampled accesses that hit. Memory and time shrink with the rate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvsim.core.errors import InputError
from kvsim.core.fenwick import Fenwick
from kvsim.core.keys import ChunkKey, KeyLayout
from kvsim.core.units import GIB
from kvsim.traces.model import Request

_MASK64 = (1 << 64) - 1
_SAMPLE_BITS = 24


class _Stack:
    """An LRU stack: depth of a key, and moving keys to the top."""

    def __init__(self) -> None:
        self.stamp: dict[ChunkKey, int] = {}
        self.fenwick = Fenwick()
        self.clock = 0

    def depth(self, key: ChunkKey) -> int:
        """1 for the most recent key; 0 when never seen (infinite depth)."""
        ts = self.stamp.get(key)
        if ts is None:
            return 0
        return len(self.stamp) - self.fenwick.prefix(ts) + 1

    def to_top(self, key: ChunkKey) -> None:
        f = self.fenwick
        ts = self.stamp.get(key)
        if ts is not None:
            f.add(ts, -1)
        self.clock += 1
        self.stamp[key] = self.clock
        f.add(self.clock, 1)


#: the shares of the infinite-cache ceiling ``kvsim mrc`` reports the capacity for
REACH_FRACTIONS = (0.5, 0.9, 0.99)


@dataclass(repr=False)
class MRC:
    """A hit-ratio curve: ``table`` has columns capacity (chunks), hit_ratio, miss_ratio,
    and, once :func:`in_capacity_units` knows the chunk's tokens (and bytes: a model),
    capacity_tokens (and cpu_gib, the GiB vLLM needs for that many chunks)."""

    table: pd.DataFrame
    protocol: str
    sample_rate: float
    accesses: int  # chunk keys seen (all, not only sampled)
    sampled: int  # accesses that were tracked
    exact_from: int  # smallest capacity where the curve is exact (prefix protocol)
    info: dict[str, Any] = field(default_factory=dict)
    chunk_tokens: int | None = None  # tokens per chunk
    row_bytes: int | None = None  # host bytes per chunk (vLLM's row), when a model is known
    model: str | None = None
    kv_cache_dtype: str = "auto"
    points: pd.DataFrame | None = None  # the curve at asked sizes (``kvsim mrc --cpu-gib``)

    def __repr__(self) -> str:
        """What the curve is, in one line (the table is ``.table``)."""
        t = self.table
        span = f"capacity {t['capacity'].min():,}-{t['capacity'].max():,} chunks" if len(t) else ""
        policy = t["policy"].iloc[0] if len(t) and "policy" in t else "?"
        return (
            f"<MRC {policy}, {self.protocol} protocol, sample rate {self.sample_rate:g}: "
            f"{len(t):,} rows, {span}, ceiling {self.ceiling:.4f}>"
        )

    def hit_ratio(self, capacity: int) -> float:
        """Hit ratio at any capacity (step function between table rows)."""
        cdf: np.ndarray = self.info["cdf"]
        # past the last entry every reuse hits: clamped as a Python int, which may be any
        # size (--cpu-gib 1e19), before numpy sees it
        return float(self._hits_at(np.asarray([min(max(int(capacity), 0), len(cdf) - 1)]))[0])

    def _hits_at(self, capacities: np.ndarray) -> np.ndarray:
        cdf: np.ndarray = self.info["cdf"]
        hits: np.ndarray = cdf[np.clip(capacities, 0, len(cdf) - 1)]
        return hits

    @property
    def ceiling(self) -> float:
        """The infinite cache's hit ratio (every reuse hits): the curve's last value, the
        ceiling of every policy at every size."""
        if "cdf" in self.info:
            return float(self.info["cdf"][-1])
        return float(self.table["hit_ratio"].max()) if len(self.table) else 0.0

    def capacity_for(self, fraction: float) -> int | None:
        """The smallest capacity (chunks) whose hit ratio reaches ``fraction`` of the
        ceiling; None when nothing can hit (no reuse)."""
        if not 0.0 < fraction <= 1.0:
            raise InputError(f"a share of the ceiling must be in (0, 1], got {fraction}")
        ceiling = self.ceiling
        if ceiling <= 0.0:
            return None
        target = fraction * ceiling * (1.0 - 1e-12)  # the curve's ratios are sums of floats
        if "cdf" in self.info:
            return max(1, int(np.searchsorted(self.info["cdf"], target, side="left")))
        t = self.table
        return int(t.loc[t["hit_ratio"] >= target, "capacity"].min())

    def gib(self, capacity: float) -> float | None:
        """GiB of ``capacity`` chunks, as vLLM allocates them (None without a model)."""
        return None if self.row_bytes is None else capacity * self.row_bytes / GIB

    def reach(self, fractions: Sequence[float] | float = REACH_FRACTIONS) -> pd.DataFrame:
        """The capacity that reaches each share of the ceiling (or of one share), in chunks,
        tokens and GiB (``exact``: :meth:`is_exact`; otherwise the curve's estimate)."""
        rows = []
        for q in [fractions] if isinstance(fractions, (int, float)) else fractions:
            c = self.capacity_for(q)
            rows.append(
                {
                    "fraction_of_ceiling": q,
                    "hit_ratio": None if c is None else self.hit_ratio_at(c),
                    "capacity": c,
                    "capacity_tokens": None
                    if c is None or not self.chunk_tokens
                    else c * self.chunk_tokens,
                    "cpu_gib": None if c is None else self.gib(c),
                    "exact": None if c is None else self.is_exact(c),
                }
            )
        return pd.DataFrame(rows)

    def is_exact(self, capacity: int) -> bool:
        """Whether the curve at ``capacity`` is a replay's exact value: unsampled, and at or
        above ``exact_from`` (below it vLLM's all-or-nothing stores can fail). A miniature
        curve's row replayed at rate 1 (a small capacity) is a full replay, so exact too."""
        if capacity < self.exact_from:
            return False
        if self.sample_rate >= 1.0:
            return True
        t = self.table
        if "sample_rate" not in t:
            return False
        row = t.loc[t["capacity"] == capacity, "sample_rate"]
        return bool(len(row)) and float(row.iloc[0]) >= 1.0

    def hit_ratio_at(self, capacity: int) -> float:
        """:meth:`hit_ratio`, or the table's step value for a curve without a CDF."""
        if "cdf" in self.info:
            return self.hit_ratio(capacity)
        t = self.table[self.table["capacity"] <= capacity]
        return float(t["hit_ratio"].iloc[-1]) if len(t) else 0.0


def in_capacity_units(
    curve: MRC,
    chunk_tokens: int,
    row_bytes: int | None = None,
    *,
    model: str | None = None,
    kv_cache_dtype: str = "auto",
) -> MRC:
    """``curve`` with its capacities also in tokens and, given the chunk's host bytes (a
    model's), in GiB: ``capacity_tokens`` and ``cpu_gib`` columns (``capacity`` chunks need
    ``capacity x row_bytes`` bytes of ``--cpu-gib``: vLLM allocates whole rows)."""
    t = curve.table.copy()
    t["capacity_tokens"] = t["capacity"].astype(np.int64) * int(chunk_tokens)
    if row_bytes is not None:
        t["cpu_gib"] = t["capacity"].astype(np.int64) * int(row_bytes) / GIB
    curve.table = t
    curve.chunk_tokens = int(chunk_tokens)
    curve.row_bytes = None if row_bytes is None else int(row_bytes)
    curve.model = model
    curve.kv_cache_dtype = kv_cache_dtype
    return curve


def labelled(curve: MRC, policy: str) -> MRC:
    """``curve`` with the columns a figure and a reader of its table need: ``policy`` (the
    curve's own, so a plot of the CSV names it) and ``exact`` (:meth:`MRC.is_exact` per row:
    estimated points are drawn as estimates)."""
    t = curve.table.copy()
    t["policy"] = policy
    t["exact"] = [curve.is_exact(int(c)) for c in t["capacity"]]
    if curve.model is not None:
        t["model"] = curve.model
    curve.table = t
    return curve


def at_sizes(
    curve: MRC, cpu_gib: Sequence[float], chunks_for: Callable[[float], int]
) -> pd.DataFrame:
    """The curve at each asked size: ``chunks_for(gib)`` is the tier vLLM (and ``kvsim
    replay --cpu-gib``) makes of it, so each hit ratio is that replay's (exactly, for
    ``exact``)."""
    rows = []
    for asked in cpu_gib:
        c = chunks_for(asked)
        rows.append(
            {
                "cpu_gib_asked": float(asked),
                "capacity": c,
                "capacity_tokens": c * curve.chunk_tokens if curve.chunk_tokens else None,
                "cpu_gib": curve.gib(c),
                "hit_ratio": curve.hit_ratio_at(c),
                "exact": curve.is_exact(c),
            }
        )
    return pd.DataFrame(rows)


def _mix64(z: int) -> int:
    """splitmix64's finaliser: every input bit moves every output bit. Trace ids are small
    consecutive integers, and the most shared prefix blocks have the smallest ids; a plain
    multiplicative hash kept id 0 at every rate (and over-sampled the hottest keys)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def key_scorer(seed: int) -> Callable[[ChunkKey], int]:
    """A key's salted hash score in ``[0, 2**24)``: SHARDS keeps a key at rate ``r`` iff its
    score is below :func:`rate_threshold` ``(r)``, so the samples of one seed nest (a key
    kept at ``r`` is kept at every larger rate)."""
    salt = _mix64(seed & _MASK64)
    shift = 64 - _SAMPLE_BITS

    def score(key: ChunkKey) -> int:
        return _mix64((hash(key) ^ salt) & _MASK64) >> shift

    return score


def rate_threshold(rate: float) -> int:
    """The score below which a key is kept at ``rate``."""
    return int(rate * (1 << _SAMPLE_BITS))


def key_sampler(rate: float, seed: int) -> Callable[[ChunkKey], bool] | None:
    """SHARDS' fixed-rate spatial filter: keeps a key iff its salted hash is below the rate,
    so a key is always or never sampled (None keeps every key)."""
    if rate >= 1.0:
        return None
    threshold = rate_threshold(rate)
    score = key_scorer(seed)

    def keep(key: ChunkKey) -> bool:
        return score(key) < threshold

    return keep


def _record_object(stack: _Stack, keys: list[ChunkKey], scale: float, hist: dict[int, int]) -> None:
    """Object protocol: each key is one access, at its own (scaled) depth."""
    for key in keys:
        d = stack.depth(key)
        d = int(np.ceil(d * scale)) if d else 0
        hist[d] = hist.get(d, 0) + 1
        stack.to_top(key)


def _record_prefix(stack: _Stack, keys: list[ChunkKey], scale: float, hist: dict[int, int]) -> None:
    """Prefix protocol: chunk j hits at the deepest (scaled) depth of chunks 0..j (0 = a miss at
    every capacity from the first never-seen chunk on); then the request's keys go to the top,
    head on top."""
    running = 1
    for key in keys:
        d = stack.depth(key)
        if running:
            running = max(running, int(np.ceil(d * scale))) if d else 0
        hist[running] = hist.get(running, 0) + 1
    for key in reversed(keys):
        stack.to_top(key)


def _hit_cdf(hist: dict[int, int], sampled: int) -> tuple[np.ndarray, int]:
    """``(cdf, max_depth)``: ``cdf[c]`` is the share of sampled accesses that hit at capacity c."""
    max_depth = max((d for d in hist if d), default=1)
    counts = np.zeros(max_depth + 2)
    for d, n in hist.items():
        if d:
            counts[d] += n
    cdf_hits = np.cumsum(counts)
    return cdf_hits / max(sampled, 1), max_depth


def _capacity_grid(max_depth: int, capacities: Sequence[int] | None, points: int) -> np.ndarray:
    """The capacities of the table: the caller's, or ``points`` geometric and ``points`` linear
    steps up to one past the deepest access."""
    if capacities is not None:
        return np.asarray(sorted(set(int(c) for c in capacities)))
    top = max_depth + 1
    if points >= top:  # every capacity: no grid needs more rows than that
        return np.arange(1, top + 1)
    return np.unique(
        np.concatenate(
            [
                np.geomspace(1, top, num=points).astype(int),
                np.linspace(1, top, num=points).astype(int),
            ]
        )
    )


def lru_mrc(
    requests: Iterable[Request],
    layout: KeyLayout,
    *,
    protocol: str = "prefix",
    sample_rate: float = 1.0,
    seed: int = 0,
    capacities: Sequence[int] | None = None,
    points: int = 200,
) -> MRC:
    """One-pass LRU hit-ratio curve of a trace (see the module docstring)."""
    if protocol not in ("prefix", "object"):
        raise InputError(f"--protocol must be prefix or object, got {protocol!r}")
    if not 0.0 < sample_rate <= 1.0:
        raise InputError(f"--sample-rate must be in (0, 1], got {sample_rate}")
    keep = key_sampler(sample_rate, seed)
    scale = 1.0 / sample_rate
    record = _record_object if protocol == "object" else _record_prefix
    stack = _Stack()
    hist: dict[int, int] = {}  # scaled depth (0 = never) -> sampled accesses
    accesses = sampled = total_units = longest = 0
    unit_keys_of, chunk_keys_of = layout.unit_keys, layout.chunk_keys
    for req in requests:
        units = unit_keys_of(req.block_hashes, req.input_tokens)
        total_units += len(units)
        keys = list(dict.fromkeys(chunk_keys_of(units)))
        accesses += len(keys)
        longest = max(longest, len(keys))
        if keep is not None:
            keys = [k for k in keys if keep(k)]
        sampled += len(keys)
        record(stack, keys, scale, hist)
    if keep is not None and sampled == 0 and accesses:
        raise InputError(
            f"--sample-rate {sample_rate} kept none of the trace's {accesses:,} chunk accesses; "
            "use a larger rate (about 100 / accesses or more)"
        )
    cdf, max_depth = _hit_cdf(hist, sampled)
    if protocol == "prefix":
        # the replay's ratio is per prompt unit; a chunk holds units_per_chunk units
        cdf = cdf * accesses * layout.units_per_chunk / max(total_units, 1)
    grid = _capacity_grid(max_depth, capacities, points)
    info = {"cdf": cdf, "longest_request_chunks": longest, "prompt_units": total_units}
    hits = cdf[np.clip(grid, 0, len(cdf) - 1)]
    table = pd.DataFrame({"capacity": grid, "hit_ratio": hits, "miss_ratio": 1.0 - hits})
    exact_from = longest if protocol == "prefix" else 1
    return MRC(table, protocol, sample_rate, accesses, sampled, exact_from, info)
