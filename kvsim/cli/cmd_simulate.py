"""``kvsim simulate``: timed mode (discrete-event vLLM-like engine with CPU offloading)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import click

from kvsim.api import BASELINE_PREFIX, simulate
from kvsim.cli.common import (
    FC,
    check_output_path,
    note_missing_reuse,
    offload_options,
    pop_offload_kwargs,
    schema_option,
    wants_progress,
)
from kvsim.cli.trace_cache_options import trace_cache_options
from kvsim.core.errors import EngineStalled, InputError
from kvsim.engine.chrome_trace import write_chrome_trace
from kvsim.options.runs import SimulateOptions
from kvsim.options.tiers import tier_from_shorthand
from kvsim.report.result import Result, format_value
from kvsim.report.serve_metrics import metric_keys
from kvsim.traces import as_trace

#: rows before the latency metrics
RUN_ROWS = (
    ("requests", "requests"),
    ("completed", "completed"),
    ("failed", "failed (too long for GPU KV)"),
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


def show(key: str, value: Any, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and key.endswith(_TWO_DECIMALS):
        return f"{value:{'+' if signed else ''},.2f}"
    if signed and isinstance(value, (int, float)) and not isinstance(value, bool):
        text = format_value(value)
        return text if text.startswith("-") else "+" + text
    return format_value(value)


def format_comparison(result: Result, baseline: bool) -> str:
    """The run as a table (one value column; with ``--baseline`` the run without offloading,
    the difference and the difference in % of it too)."""
    summary = result.summary
    head = (
        f"kvsim simulate: {summary['trace']} "
        f"({summary['model']} on {summary['gpu']}, link {summary['link']})"
    )
    keyed = [*RUN_ROWS, *metric_rows(summary), *LOAD_ROWS, *CACHE_ROWS, *tier_rows(summary)]
    rows = [(key, label) for key, label in keyed if summary.get(key) is not None]
    diff = result.compare() if baseline else None
    table = []
    for key, label in rows:
        cells = [show(key, summary[key])]
        if diff is not None:
            cells.append(show(key, summary.get(BASELINE_PREFIX + key)))
            if key in diff.index:
                d, ratio = diff.loc[key, "difference"], diff.loc[key, "ratio"]
                pct = (ratio - 1) * 100 if not math.isnan(ratio) else None
                if isinstance(summary[key], int) and not isinstance(summary[key], bool):
                    d = int(d)
                cells += [show(key, d, signed=True), "-" if pct is None else f"{pct:+.1f}%"]
            else:
                cells += ["-", "-"]
        table.append((label, cells))
    names = [("offload" if summary.get("offload") else "no offload")]
    if baseline:
        names += ["no offload", "delta", "delta %"]
    w = max(len(label) for label, _ in table)
    widths = [max(len(n), *(len(c[i]) for _, c in table)) for i, n in enumerate(names)]
    lines = [head, "-" * len(head)]
    if baseline:
        lines.append(f"{'':<{w}}" + "".join(f"  {n:>{cw}}" for n, cw in zip(names, widths)))
    for label, cells in table:
        lines.append(f"{label:<{w}}" + "".join(f"  {c:>{cw}}" for c, cw in zip(cells, widths)))
    return "\n".join(lines)


def _option(name: str, *flags: str, **overrides: Any) -> Callable[[FC], FC]:
    """A ``simulate`` option from :class:`SimulateOptions`' description of ``name``."""
    return schema_option(SimulateOptions, name, *flags, **overrides)


def write_tables(result: Result, out: str) -> list[str]:
    """The run's files into ``out`` as one set (see :meth:`kvsim.report.result.Result.save`)."""
    return result.save(out)


@click.command("simulate")
@click.argument("trace", type=click.Path(dir_okay=False))
@offload_options
@_option("gpu", show_default=True)
@_option("baseline", is_flag=True, default=False)
@_option("limit")
@_option("time_scale", show_default=True)
@_option("poisson_rate")
@_option("max_num_batched_tokens")
@_option("max_num_seqs")
@_option("gpu_memory_utilization", show_default=True)
@click.option(
    "--no-prefix-caching",
    "--no-enable-prefix-caching",
    "no_prefix_caching",
    is_flag=True,
    help="Disable the GPU prefix cache.",
)
@click.option(
    "--offload-all-tokens",
    is_flag=True,
    help="Store decode chunks too (vLLM offload_prompt_only=false).",
)
@_option("sync_load_budget_bytes")
@_option("async_scheduling", "--async-scheduling/--no-async-scheduling", show_default=True)
@_option("link")
@_option("compute_profile", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write requests/transfers/steps tables (Parquet + CSV) and summary.json here.",
)
@click.option(
    "--chrome-trace",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a Perfetto / Chrome trace of steps and transfers.",
)
@_option("percentile_metrics")
@_option("metric_percentiles", default="99", show_default=True)
@_option("goodput", multiple=True)
@click.option(
    "--save-detailed",
    is_flag=True,
    help="With --out: bench.json gets vLLM's per-request lists (ttfts, itls, ...) and the "
    "folder a tokens table (one row per output token).",
)
@click.option(
    "--tier",
    "tiers",
    multiple=True,
    metavar="TYPE[:KEY=VALUE,...]",
    help="A secondary tier behind the CPU tier, as vLLM's TieringOffloadingSpec (repeatable, "
    "in order; replaces --vllm-config's secondary_tiers), e.g. fs:device=nvme-gen5 or "
    "obj:capacity=10TiB. device= picks its device model (nvme-gen4, the fs default; "
    "nvme-gen5; shared-fs; object-store, the obj default; instant; or a device JSON file).",
)
@_option("tier_load_rule")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Progress bar on stderr (default: when stderr is a terminal).",
)
@trace_cache_options
def simulate_command(
    trace: str,
    gpu: str,
    baseline: bool,
    limit: int | None,
    time_scale: float,
    poisson_rate: float | None,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    gpu_memory_utilization: float,
    no_prefix_caching: bool,
    offload_all_tokens: bool,
    sync_load_budget_bytes: int | None,
    async_scheduling: bool,
    link: str | None,
    compute_profile: str | None,
    out_dir: str | None,
    chrome_trace: str | None,
    percentile_metrics: str | None,
    metric_percentiles: str,
    goodput: tuple[str, ...],
    save_detailed: bool,
    as_json: bool,
    show_progress: bool | None,
    vllm_config: str | None,
    tiers: tuple[str, ...] = (),
    tier_load_rule: str | None = None,
    **kwargs: Any,
) -> None:
    """Replay TRACE's arrivals through a modelled vLLM engine with CPU KV offloading.

    Prints what vllm bench serve does (TTFT, TPOT, ITL, E2EL and queue time in ms: mean,
    median, std, percentiles; request and token throughput; goodput under --goodput), the
    load (an overloaded run warns on stderr), GPU and CPU hit tokens, recomputed tokens,
    bytes loaded and stored and PCIe utilisation. --out DIR also gets bench.json under
    vllm bench serve's field names, a long metrics table (run, metric, value) and
    metadata.json. --gpu-blocks here sets the GPU
    KV capacity in vLLM blocks of --gpu-block-tokens tokens (default: from GPU memory).
    Without a CPU size the run has no offloading.

    \b
    Example:
      kvsim simulate traces/mooncake_fast25_conversation_trace.jsonl \\
          --model llama-3.1-8b --gpu h200 --cpu-gib 64 --policy arc --baseline
    """
    options = pop_offload_kwargs(kwargs)
    gpu_blocks = options.pop("gpu_blocks", None) or None
    if out_dir is not None:
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise InputError(f"--out: {out_dir} is not a directory")
        os.makedirs(out_dir, exist_ok=True)
    check_output_path(chrome_trace, "--chrome-trace", trace, vllm_config, compute_profile, link)
    if save_detailed and not out_dir:
        raise InputError("--save-detailed writes into --out; give --out DIR")
    if tiers:  # vLLM's secondary_tiers objects, in order
        options["secondary_tiers"] = [tier_from_shorthand(text) for text in tiers]
    info = as_trace(trace, block_tokens=kwargs.get("block_tokens")).info
    try:
        result = simulate(
            trace,
            gpu=gpu,
            baseline=baseline,
            limit=limit,
            time_scale=time_scale,
            poisson_rate=poisson_rate,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            gpu_kv_blocks=gpu_blocks,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=not no_prefix_caching,
            offload_prompt_only=False if offload_all_tokens else None,
            sync_load_budget_bytes=sync_load_budget_bytes,
            async_scheduling=async_scheduling,
            link=link,
            compute_profile=compute_profile,
            record_steps=bool(out_dir or chrome_trace),
            record_tokens=save_detailed,
            percentile_metrics=percentile_metrics,
            metric_percentiles=metric_percentiles,
            goodput=" ".join(goodput) if goodput else None,
            vllm_config=vllm_config,
            tier_load_rule=tier_load_rule,
            progress=wants_progress(show_progress),
            **{k: v for k, v in options.items() if v is not None},
        )
    except EngineStalled as exc:  # what ran until the stall is written, then one line
        if out_dir and exc.result is not None:
            write_tables(exc.result, out_dir)
            exc.args = (f"{exc}; what was simulated until then is in {out_dir}",)
        raise
    if out_dir:
        write_tables(result, out_dir)
    if chrome_trace:
        write_chrome_trace(
            chrome_trace,
            result.tables["steps"],
            result.tables["transfers"],
            result.tables.get("tier_jobs"),
        )
    if as_json:
        click.echo(json.dumps(result.summary, indent=2, default=str))
    else:
        click.echo(format_comparison(result, baseline))
    note_missing_reuse(info)  # after the run: an error stays the only line on stderr


COMMANDS = [simulate_command]
