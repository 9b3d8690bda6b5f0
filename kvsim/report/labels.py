"""Labels, units and number formats of summary metrics: one home for the CLI's tables,
``Result.compare()`` and notebooks, so that a figure copied from any of them reads the same
(``duration (s)``, ``mean TTFT (ms)``, ``1,234.56``)."""

from __future__ import annotations

import math
from typing import Any

#: rows before the latency metrics
RUN_ROWS = (
    ("requests", "requests"),
    ("completed", "completed"),
    ("failed", "failed (too long to admit)"),  # GPU KV, or the budget without chunked prefill
    ("duration", "duration (s)"),
    ("request_throughput", "request throughput (req/s)"),
    ("request_goodput", "request goodput (req/s)"),
    ("output_throughput", "output token throughput (tok/s)"),
    ("total_token_throughput", "total token throughput (tok/s)"),
    ("max_output_tokens_per_s", "peak output token throughput (tok/s)"),
    ("max_concurrent_requests", "peak concurrent requests"),
)
#: rows after them: the load, then the cache and the link
LOAD_ROWS = (
    ("gpu_busy_frac", "GPU busy (fraction of the run)"),
    ("offered_prompt_tok_s", "offered prompt tokens/s"),
    ("sustainable_prompt_tok_s", "sustainable prompt tokens/s"),
    ("queue_share_of_ttft", "queueing share of TTFT"),
)
CACHE_ROWS = (
    ("gpu_hit_tokens", "GPU hit tokens"),
    ("cpu_hit_tokens", "CPU hit tokens"),
    ("computed_prompt_tokens", "computed prompt tokens"),
    ("recomputed_tokens", "recomputed tokens (preemption)"),
    ("preemptions", "preemptions"),
    ("load_bytes", "load bytes"),
    ("store_bytes", "store bytes"),
    ("chunks_evicted", "CPU chunks evicted"),
    ("allocation_failures", "CPU allocation failures"),
    ("flush_and_sync_stall_s", "transfer stalls (s)"),
    ("pcie_h2d_util", "PCIe H2D utilisation"),
    ("pcie_d2h_util", "PCIe D2H utilisation"),
    ("kv_wait_total_s", "waiting for KV (s, total)"),
    ("steps", "engine steps"),
)
METRIC_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL", "queue": "queue"}
#: values shown with two decimals (milliseconds and rates), as vllm bench serve prints them
_TWO_DECIMALS = ("_ms", "throughput", "goodput", "_per_s", "_tok_s")


def metric_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``mean_ttft_ms`` -> ``mean TTFT (ms)``, ``p99_itl_ms`` -> ``P99 ITL (ms)``, in order."""
    from kvsim.report.serve_metrics import metric_keys  # numpy and pandas: not at start-up

    rows = []
    for key in metric_keys(summary):
        stat, name = key[: -len("_ms")].rsplit("_", 1)
        stat = stat.upper() if stat.startswith("p") else stat
        rows.append((key, f"{stat} {METRIC_LABELS[name]} (ms)"))
    return rows


#: a secondary tier's rows: summary key suffix -> label (after the tier's label)
TIER_ROWS = (
    ("device", "device"),
    ("hit_tokens", "hit tokens"),
    ("promoted_chunks", "promoted chunks"),
    ("promotion_p50_ms", "promotion P50 (ms)"),
    ("promotion_p99_ms", "promotion P99 (ms)"),
    ("cascaded_chunks", "cascaded chunks"),
    ("dropped_chunks", "dropped chunks (back-pressure)"),
    ("read_bytes", "bytes read"),
    ("written_bytes", "bytes written"),
    ("load_rule_skipped_chunks", "chunks skipped by the load rule"),
)
TIER_TOTAL_ROWS = (
    ("tier_hit_requests", "requests with a secondary-tier hit"),
    ("tier_loads_lost", "of them, loading slower than recompute"),
    ("tier_load_rule", "tier load rule"),
)


def tier_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The secondary tiers' rows (``tier1_fs_device`` -> ``tier 1:fs device``), if any."""
    rows = []
    for key in summary:
        if key.startswith("tier") and key.endswith("_device"):
            prefix = key[: -len("device")]
            number, kind = prefix[len("tier") : -1].split("_", 1)
            rows += [(prefix + k, f"tier {number}:{kind} {label}") for k, label in TIER_ROWS]
    return [*rows, *TIER_TOTAL_ROWS] if rows else []


def format_metric(key: str, value: Any, signed: bool = False) -> str:
    """One summary value as every table shows it: milliseconds and rates with two decimals
    (as vllm bench serve prints them), the rest by :func:`format_value`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and key.endswith(_TWO_DECIMALS):
        return f"{value:{'+' if signed else ''},.2f}"
    if signed and isinstance(value, (int, float)) and not isinstance(value, bool):
        text = format_value(value)
        return text if text.startswith("-") else "+" + text
    return format_value(value)


#: a fleet's own rows (docs/fleets.md), shown when the run is a fleet
FLEET_ROWS = (
    ("instances", "instances"),
    ("router", "router"),
    ("shared_tier", "shared tier"),
    ("shared_hit_tokens", "shared-tier hit tokens"),
    ("max_requests_per_instance", "max requests per instance"),
    ("mean_requests_per_instance", "mean requests per instance"),
    ("token_imbalance", "prompt tokens: max / mean instance"),
)


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key, label)`` of every metric a run's table shows, in the table's order (run,
    latencies, load, cache and link, secondary tiers, a fleet's), for the keys ``summary``
    has."""
    keyed = [
        *RUN_ROWS,
        *metric_rows(summary),
        *LOAD_ROWS,
        *CACHE_ROWS,
        *tier_rows(summary),
        *FLEET_ROWS,
    ]
    return [(key, label) for key, label in keyed if summary.get(key) is not None]


def label_of(key: str, summary: dict[str, Any] | None = None) -> str:
    """A metric's label with its unit (the tables' own), else the key made readable."""
    known = dict(summary_rows(summary)) if summary is not None else {}
    if key in known:
        return known[key]
    for k, label in (*RUN_ROWS, *LOAD_ROWS, *CACHE_ROWS):
        if k == key:
            return label
    if key.endswith("_ms") and key.count("_") >= 2:
        stat, name = key[: -len("_ms")].rsplit("_", 1)
        if name in METRIC_LABELS:
            stat = stat.upper() if stat.startswith("p") else stat
            return f"{stat} {METRIC_LABELS[name]} (ms)"
    return key.replace("_", " ")


def format_value(value: Any) -> str:
    """A number as kvsim's tables print it: thousands separated, four decimals below 1
    (ratios), two below 1,000, one above (so a column reads alike)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) < 1:
            return f"{value:.4f}"
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _number(value: Any) -> str:
    """A parameter's number as a label reads it: ``16``, ``0.5``, ``1,600``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


#: how one run parameter reads in a line's label, where the bare value says what it is
#: (others read ``name=value``): the policy as the figures name it, sizes with their unit
PARAMETER_TEXT = {
    "policy": lambda v: str(v).upper(),
    "cpu_gib": lambda v: f"{_number(v)} GiB",
    "cpu_chunks": lambda v: f"{_number(v)} chunks",
    "cpu_bytes": lambda v: f"{_number(v)} B",
    "trace": lambda v: str(v).replace("\\", "/").rsplit("/", 1)[-1],
}


def parameter_text(name: str, value: Any) -> str:
    """One parameter of a run in a line's label: ``LRU``, ``64 GiB``, ``store_threshold=2``."""
    text = PARAMETER_TEXT.get(name)
    return text(value) if text is not None else f"{name}={_number(value)}"


def cell_label(values: dict[str, Any]) -> str:
    """A line's label from the parameters that tell it from the others (a sweep's cell, a
    configuration's curve), policy first: ``LRU, 64 GiB, store_threshold=2``."""
    names = sorted(values, key=lambda n: n != "policy")  # stable: given order otherwise
    return ", ".join(parameter_text(n, values[n]) for n in names)
