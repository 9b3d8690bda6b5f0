"""A fleet's outputs: the single engine's summary for the fleet as a whole, and the
per-instance tables (hits per tier, load balance, queueing).

Summary rule: a count (an int that is not configuration) is the sum over the instances; a
``*_ratio`` of hits is recomputed from the summed hits and prompt blocks; configuration
(chunk sizes, capacities per instance, policy, the shared tier's own store counts, which
every instance sees alike) is instance 0's; any other float (a promotion-time
percentile, a stall time) is the mean over the instances that have one. So a script
written for one engine reads a fleet unchanged, and a fleet of one has exactly the
engine's summary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: per-instance configuration in a cache-mode summary (not summed)
CONFIG_KEYS = frozenset(
    {
        "block_tokens",
        "unit_tokens",
        "cpu_chunks",
        "chunk_tokens",
        "chunk_bytes",
        "gpu_blocks",
        "store_threshold",
        "kv_bytes_per_token",
        "cpu_bytes",
        "cpu_gib",
        "gpu_kv_blocks",
        "gpu_block_tokens",
    }
)


def merge_cache_summaries(
    summaries: Sequence[dict[str, Any]], shared_prefix: str | None = None
) -> dict[str, Any]:
    """The fleet's cache-mode summary from its instances' (see the module's rule);
    ``shared_prefix``: the shared tier's key prefix (``tier1_obj``), whose store counts are
    one store's, not a sum."""
    first = summaries[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if key.endswith("_ratio"):
            continue
        values = [s.get(key) for s in summaries]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        one_store = (
            shared_prefix is not None
            and key.startswith(shared_prefix + "_")
            and (key.endswith(("_resident_chunks", "_evicted_chunks", "_capacity_chunks")))
        )
        if key in CONFIG_KEYS or key.endswith("_capacity_chunks") or one_store or not numbers:
            out[key] = value
        elif all(isinstance(v, int) for v in numbers):
            out[key] = sum(numbers)
        else:  # a float (or an instance without the event: None)
            out[key] = _mean([float(v) for v in numbers])
    blocks = out.get("prompt_blocks", 0)
    for key in first:
        if not key.endswith("_ratio"):
            continue
        if key == "combined_hit_ratio":
            hits = out["gpu_hit_blocks"] + out["cpu_hit_blocks"]
        else:
            hits = out.get(key.removesuffix("_ratio") + "_blocks")
            if hits is None:  # a ratio without its blocks: the instances' mean
                out[key] = sum(s[key] for s in summaries) / len(summaries)
                continue
        out[key] = hits / blocks if blocks else 0.0
    # keep the engine's key order
    return {key: out[key] for key in first}


def _mean(values: list[float]) -> float:
    """The mean of the values that are numbers (NaN: an instance without the event); the
    value itself for one instance."""
    if len(values) == 1:
        return values[0]
    known = [v for v in values if not math.isnan(v)]
    return sum(known) / len(known) if known else math.nan


def balance_fields(requests: Sequence[int], tokens: Sequence[int]) -> dict[str, Any]:
    """Load balance: max and mean requests and prompt tokens per instance, and max / mean."""
    n = len(requests)
    mean_r = sum(requests) / n
    mean_t = sum(tokens) / n
    return {
        "max_requests_per_instance": max(requests),
        "mean_requests_per_instance": mean_r,
        "max_prompt_tokens_per_instance": max(tokens),
        "mean_prompt_tokens_per_instance": mean_t,
        "request_imbalance": max(requests) / mean_r if mean_r else 0.0,
        "token_imbalance": max(tokens) / mean_t if mean_t else 0.0,
    }
