"""``kvsim simulate``: timed mode (discrete-event vLLM-like engine with CPU offloading)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import click

from kvsim.api import BASELINE_PREFIX, simulate
from kvsim.cli.common import (
    check_output_path,
    note_missing_reuse,
    offload_options,
    pop_offload_kwargs,
    progress_bar,
)
from kvsim.engine.chrome_trace import write_chrome_trace
from kvsim.errors import InputError
from kvsim.io import atomic_path, atomic_write
from kvsim.results import RUN_MARKER, Result, format_value
from kvsim.traces import as_trace

SHOWN = (
    ("requests", "requests"),
    ("finished", "finished"),
    ("rejected", "rejected (too long for GPU KV)"),
    ("duration_s", "duration (s)"),
    ("ttft_p50_s", "TTFT p50 (s)"),
    ("ttft_p90_s", "TTFT p90 (s)"),
    ("ttft_p99_s", "TTFT p99 (s)"),
    ("tpot_p50_s", "TPOT p50 (s)"),
    ("tpot_mean_s", "TPOT mean (s)"),
    ("output_throughput_tok_s", "output throughput (tok/s)"),
    ("total_throughput_tok_s", "total throughput (tok/s)"),
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


def format_comparison(summary: dict[str, Any], baseline: bool) -> str:
    head = (
        f"kvsim simulate: {summary['trace']} "
        f"({summary['model']} on {summary['gpu']}, link {summary['link']})"
    )
    rows = [
        (
            label,
            format_value(summary.get(key)),
            format_value(summary.get(BASELINE_PREFIX + key)) if baseline else None,
        )
        for key, label in SHOWN
        if key in summary
    ]
    w = max(len(r[0]) for r in rows)
    w1 = max(len("offload"), *(len(r[1]) for r in rows))
    lines = [head, "-" * len(head)]
    if baseline:
        lines.append(f"{'':<{w}}  {'offload':>{w1}}  {'no offload':>12}")
    for label, v, b in rows:
        lines.append(
            f"{label:<{w}}  {v:>{w1}}"
            + (f"  {(b if b != 'None' else '-'):>12}" if baseline else "")
        )
    return "\n".join(lines)


def write_tables(result: Result, out: str) -> list[str]:
    """Each table as Parquet and CSV, plus summary.json and config.json, each file atomically,
    as one set: the completion marker goes first (readers then know the set is being
    replaced), every file is written, an earlier run's files this one does not write are
    removed, and the marker listing the new set is written last."""
    os.makedirs(out, exist_ok=True)
    marker = os.path.join(out, RUN_MARKER)
    previous: list[str] = []
    if os.path.exists(marker):
        with contextlib.suppress(OSError, ValueError), open(marker, encoding="utf-8") as f:
            previous = list(json.load(f).get("files", []))
        os.unlink(marker)
    written = []
    for name, df in result.tables.items():
        with atomic_path(os.path.join(out, f"{name}.parquet")) as tmp:
            df.to_parquet(tmp, engine="pyarrow", index=False)
        with atomic_write(os.path.join(out, f"{name}.csv"), newline="") as f:
            df.to_csv(f, index=False)
        written += [f"{name}.parquet", f"{name}.csv"]
    for name, data in (("summary", result.summary), ("config", result.config)):
        with atomic_write(os.path.join(out, f"{name}.json")) as f:
            json.dump(data, f, indent=2, default=str)
        written.append(f"{name}.json")
    for stale in set(previous) - set(written):
        if os.path.basename(stale) == stale:  # only plain names the marker listed
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(out, stale))
    with atomic_write(marker) as f:
        json.dump({"complete": True, "files": written}, f, indent=2)
    return written


@click.command("simulate")
@click.argument("trace", type=click.Path(dir_okay=False))
@offload_options
@click.option(
    "--gpu", default="h200", show_default=True, help="GPU preset: h100, h200, a100, l40s, gh200."
)
@click.option(
    "--baseline", is_flag=True, help="Also run without offloading and print both side by side."
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Simulate only the first N requests."
)
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Multiply trace timestamps by this (0.5 = twice the request rate).",
)
@click.option(
    "--poisson-rate",
    type=float,
    default=None,
    help="Re-time arrivals as Poisson at this rate (req/s, seeded).",
)
@click.option(
    "--max-num-batched-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Token budget per step (default: vllm serve's for the GPU; H100/H200: 8192).",
)
@click.option(
    "--max-num-seqs",
    type=click.IntRange(min=1),
    default=None,
    help="Running requests per step (default: vllm serve's for the GPU; H100/H200: 1024).",
)
@click.option("--gpu-memory-utilization", type=float, default=0.92, show_default=True)
@click.option("--no-prefix-caching", is_flag=True, help="Disable the GPU prefix cache.")
@click.option(
    "--offload-all-tokens",
    is_flag=True,
    help="Store decode chunks too (vLLM offload_prompt_only=false).",
)
@click.option(
    "--sync-load-budget-bytes",
    type=click.IntRange(min=0),
    default=None,
    help=(
        "vLLM sync_load_budget_bytes: small CPU hits load in the same step "
        "(default: --vllm-config's, else 0)."
    ),
)
@click.option(
    "--async-scheduling/--no-async-scheduling",
    default=True,
    show_default=True,
    help="vLLM's async scheduling (its default): schedule the next step while one runs.",
)
@click.option(
    "--link",
    default=None,
    help=(
        "Link preset (pcie5, pcie4, gh200), a calibration profile JSON, or a constant link "
        '{"kind": "constant", "h2d_bytes_per_s": X, "d2h_bytes_per_s": Y} in a JSON file.'
    ),
)
@click.option(
    "--compute-profile",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help=(
        "JSON of roofline coefficients replacing the GPU preset's, or a linear step time "
        '{"kind": "linear", "step_s": A, "per_token_s": B}.'
    ),
)
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
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Progress bar on stderr (default: when stderr is a terminal).",
)
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
    as_json: bool,
    show_progress: bool | None,
    vllm_config: str | None,
    **kwargs: Any,
) -> None:
    """Replay TRACE's arrivals through a modelled vLLM engine with CPU KV offloading.

    Prints TTFT / TPOT percentiles, throughput, GPU and CPU hit tokens, recomputed
    tokens, bytes loaded and stored and PCIe utilisation. --gpu-blocks here sets the GPU
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
    info = as_trace(trace, block_tokens=kwargs.get("block_tokens")).info
    runs = 2 if baseline else 1
    with progress_bar(show_progress, trace, limit, "simulating", runs) as bar:
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
            vllm_config=vllm_config,
            progress=bar,
            **{k: v for k, v in options.items() if v is not None},
        )
    if out_dir:
        write_tables(result, out_dir)
    if chrome_trace:
        write_chrome_trace(chrome_trace, result.tables["steps"], result.tables["transfers"])
    if as_json:
        click.echo(json.dumps(result.summary, indent=2, default=str))
    else:
        click.echo(format_comparison(result.summary, baseline))
    note_missing_reuse(info)  # after the run: an error stays the only line on stderr


COMMANDS = [simulate_command]
