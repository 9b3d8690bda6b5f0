"""``kvsim simulate``: timed mode (discrete-event vLLM-like engine with CPU offloading)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import click

from kvsim.api import BASELINE_PREFIX, simulate
from kvsim.cli.common import (
    FC,
    check_output_folder,
    check_output_path,
    fleet_options,
    note_missing_reuse,
    offload_options,
    plugin_output_to_stderr,
    pop_fleet_kwargs,
    pop_offload_kwargs,
    save_fleet_figure,
    schema_option,
    wants_progress,
)
from kvsim.cli.trace_cache_options import trace_cache_options
from kvsim.core.errors import EngineStalled, InputError
from kvsim.core.input_files import referenced_files
from kvsim.core.io import json_text, output_folder
from kvsim.engine.chrome_trace import write_chrome_trace
from kvsim.options.runs import SimulateOptions
from kvsim.options.tiers import tier_from_shorthand
from kvsim.report.labels import format_metric, summary_rows
from kvsim.report.result import Result, run_folder_receives
from kvsim.traces import as_trace


def format_comparison(result: Result, baseline: bool) -> str:
    """The run as a table (one value column; with ``--baseline`` the run without offloading,
    the difference and the difference in % of it too)."""
    summary = result.summary
    head = (
        f"kvsim simulate: {summary['trace']} "
        f"({summary['model']} on {summary['gpu']}, link {summary['link']})"
    )
    rows = summary_rows(summary)
    diff = result.compare() if baseline else None
    table = []
    for key, label in rows:
        cells = [format_metric(key, summary[key])]
        if diff is not None:
            cells.append(format_metric(key, summary.get(BASELINE_PREFIX + key)))
            if key in diff.index:
                d, ratio = diff.loc[key, "difference"], diff.loc[key, "ratio"]
                pct = (ratio - 1) * 100 if not math.isnan(ratio) else None
                if isinstance(summary[key], int) and not isinstance(summary[key], bool):
                    d = int(d)
                cells += [
                    format_metric(key, d, signed=True),
                    "-" if pct is None else f"{pct:+.1f}%",
                ]
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


#: the per-stage table's columns: stages-table column -> heading
STAGE_COLUMNS = (
    ("stage", "stage"),
    ("requests", "requests"),
    ("failed", "failed"),
    ("request_throughput", "req/s"),
    ("output_throughput", "out tok/s"),
    ("mean_ttft_ms", "TTFT mean"),
    ("p50_ttft_ms", "p50"),
    ("p90_ttft_ms", "p90"),
    ("p99_ttft_ms", "p99"),
    ("mean_e2el_ms", "E2EL mean"),
    ("p90_e2el_ms", "p90"),
    ("p99_e2el_ms", "p99"),
    ("mean_itl_ms", "ITL mean"),
    ("gpu_hit_tokens", "GPU hit tok"),
    ("cpu_hit_tokens", "CPU hit tok"),
)


def format_stages(result: Result) -> str | None:
    """Every load stage's main metrics (ms) and the whole run's, one row each; None for a
    run without stages."""
    table = result.tables.get("stages")
    if table is None:
        return None
    cols = [(c, h) for c, h in STAGE_COLUMNS if c in table.columns]
    cells = [[h for _, h in cols]]
    for row in table.itertuples(index=False):
        values = row._asdict()
        cells.append(
            [format_metric(c, values[c]) if c != "stage" else str(values[c]) for c, _ in cols]
        )
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = ["per load stage (the stage a request was sent in; times in ms)"]
    lines += ["  ".join(f"{c:>{w}}" for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def _option(name: str, *flags: str, **overrides: Any) -> Callable[[FC], FC]:
    """A ``simulate`` option from :class:`SimulateOptions`' description of ``name``."""
    return schema_option(SimulateOptions, name, *flags, **overrides)


def _refuse_run_file(chrome_trace: str | None, out_dir: str | None) -> None:
    """``--chrome-trace`` inside ``--out`` under the name of a file the run writes there
    (``summary.json``) would be overwritten by it, or overwrite it: refused before the run."""
    if not chrome_trace or not out_dir:
        return
    folder = os.path.dirname(os.path.realpath(chrome_trace))
    name = os.path.basename(chrome_trace)
    if os.path.samefile(folder, out_dir) and run_folder_receives(out_dir)(name):
        raise InputError(
            f"--chrome-trace {chrome_trace}: --out {out_dir} writes {name} itself; "
            "give the trace another name"
        )


def _simulate(out_dir: str | None, save_steps: bool, trace: Any, **kwargs: Any) -> Result:
    """:func:`kvsim.simulate`; when its engine stalls, what ran until then is written to
    ``out_dir`` before the one-line error (exit code 3) goes up."""
    try:
        return simulate(trace, **kwargs)
    except EngineStalled as exc:
        if out_dir and exc.result is not None:
            write_tables(exc.result, out_dir, save_steps)
            exc.args = (f"{exc}; what was simulated until then is in {out_dir}",)
        raise


def without_steps(result: Result) -> Result:
    """``result`` without its steps tables (the run's and a baseline's): what ``--out``
    writes unless ``--save-steps`` asks for them (``--chrome-trace`` records them)."""
    names = ("steps", Result.BASELINE_PREFIX + "steps")
    tables = {k: v for k, v in result.tables.items() if k not in names}
    return dataclasses.replace(result, tables=tables)


def write_tables(result: Result, out: str, save_steps: bool) -> list[str]:
    """The run's files into ``out`` as one set (see :meth:`kvsim.report.result.Result.save`),
    its steps tables only when ``save_steps``."""
    return (result if save_steps else without_steps(result)).save(out)


@click.command("simulate")
@click.argument("trace", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--workload",
    "workload_text",
    default=None,
    metavar="YAML|FILE",
    help="Instead of TRACE: a benchmark workload (with --load), e.g. '{type: shared_prefix, "
    "num_groups: 10, ...}' or a file (one holding workload: and load: blocks gives both).",
)
@click.option(
    "--load",
    "load_text",
    default=None,
    metavar="YAML|FILE",
    help="The workload's load, e.g. '{type: concurrency, stages: [{concurrency: 32, "
    "num_requests: 2000}]}' (docs/experiments.md).",
)
@offload_options
@_option("gpu", show_default=True)
@_option("baseline", is_flag=True, default=False)
@_option("limit")
@_option("time_scale", show_default=True)
@_option("poisson_rate")
@_option("max_num_batched_tokens")
@_option("max_num_seqs")
@_option("max_model_len")
@_option("gpu_memory_utilization", show_default=True)
@click.option(
    "--no-prefix-caching",
    "--no-enable-prefix-caching",
    "no_prefix_caching",
    is_flag=True,
    help="Disable the GPU prefix cache.",
)
@click.option(
    "--no-enable-chunked-prefill",
    "no_chunked_prefill",
    is_flag=True,
    help=(
        "vLLM without chunked prefill: a prompt waits for a step whose token budget holds "
        "it whole; one longer than --max-num-batched-tokens is refused (default budget: "
        "--max-model-len, as vLLM raises it to max_model_len)."
    ),
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
    help="Write the requests and transfers tables (Parquet + CSV), summary.json, bench.json "
    "and metadata.json here (the steps table too with --save-steps).",
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
    "--save-steps",
    is_flag=True,
    help="With --out: also the steps table, one row per engine step (232 bytes a step held "
    "in memory until written; a 16-instance fleet of the bundled trace runs 3.9M steps).",
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
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary as JSON (with a 'stages' list for a run with load stages).",
)
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Progress bar on stderr (default: when stderr is a terminal).",
)
@fleet_options
@trace_cache_options
def simulate_command(
    trace: str | None,
    workload_text: str | None,
    load_text: str | None,
    gpu: str,
    baseline: bool,
    limit: int | None,
    time_scale: float,
    poisson_rate: float | None,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    max_model_len: int | None,
    gpu_memory_utilization: float,
    no_prefix_caching: bool,
    no_chunked_prefill: bool,
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
    save_steps: bool,
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

    Instead of TRACE, --workload and --load run a benchmark client in the loop
    (inference-perf's shared_prefix or vllm bench serve's random data; constant, poisson
    or concurrency load in stages; docs/experiments.md). Such a run, or a trace from
    `kvsim trace gen shared-prefix / random`, also prints every metric per load stage
    (and --out writes the stages table).

    \b
    Examples:
      kvsim simulate traces/mooncake_fast25_conversation_trace.jsonl \\
          --model llama-3.1-8b --gpu h200 --cpu-gib 64 --policy arc --baseline
      kvsim simulate --gpu h100 --workload '{type: shared_prefix, num_groups: 10,
          num_prompts_per_group: 10, system_prompt_len: 100, question_len: 447,
          output_len: 248}' --load '{type: concurrency, stages: [{concurrency: 16,
          num_requests: 1000}]}'
    """
    options = pop_offload_kwargs(kwargs)
    options.update(pop_fleet_kwargs(kwargs))
    gpu_blocks = options.pop("gpu_blocks", None)
    source = click.get_current_context().get_parameter_source("gpu_blocks")
    if gpu_blocks == 0 and source is not click.core.ParameterSource.DEFAULT:
        raise InputError(  # replay's 0 (no GPU prefix cache) has no meaning here
            "--gpu-blocks 0: a timed run needs its GPU KV (at least 2 blocks; leave it out "
            "for vLLM's from GPU memory)"
        )
    gpu_blocks = gpu_blocks or None
    inputs = [trace, vllm_config, compute_profile, link, gpu, tiers, options]
    check_output_folder(out_dir, "--out", run_folder_receives(out_dir or "."), inputs)
    # made first (--chrome-trace may go inside it); removed again if the run fails
    with output_folder(out_dir):
        check_output_path(chrome_trace, "--chrome-trace", *referenced_files(inputs))
        _refuse_run_file(chrome_trace, out_dir)
        if save_detailed and not out_dir:
            raise InputError("--save-detailed writes into --out; give --out DIR")
        if save_steps and not out_dir:
            raise InputError("--save-steps writes into --out; give --out DIR")
        if tiers:  # vLLM's secondary_tiers objects, in order
            options["secondary_tiers"] = [tier_from_shorthand(text) for text in tiers]
        workload, load = _workload_and_load(trace, workload_text, load_text)
        info = as_trace(trace, block_tokens=kwargs.get("block_tokens")).info if trace else None
        with plugin_output_to_stderr():
            result = _simulate(
                out_dir,
                save_steps,
                trace,
                workload=workload,
                load=load,
                gpu=gpu,
                baseline=baseline,
                limit=limit,
                time_scale=time_scale,
                poisson_rate=poisson_rate,
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
                gpu_kv_blocks=gpu_blocks,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_prefix_caching=not no_prefix_caching,
                enable_chunked_prefill=not no_chunked_prefill,
                offload_prompt_only=False if offload_all_tokens else None,
                sync_load_budget_bytes=sync_load_budget_bytes,
                async_scheduling=async_scheduling,
                link=link,
                compute_profile=compute_profile,
                record_steps=save_steps or bool(chrome_trace),
                record_tokens=save_detailed,
                percentile_metrics=percentile_metrics,
                metric_percentiles=metric_percentiles,
                goodput=" ".join(goodput) if goodput else None,
                vllm_config=vllm_config,
                tier_load_rule=tier_load_rule,
                progress=wants_progress(show_progress),
                **{k: v for k, v in options.items() if v is not None},
            )
        if out_dir:
            write_tables(result, out_dir, save_steps)
            save_fleet_figure(result, out_dir)
        if chrome_trace:
            write_chrome_trace(
                chrome_trace,
                result.tables["steps"],
                result.tables["transfers"],
                result.tables.get("tier_jobs"),
            )
        if as_json:
            payload = dict(result.summary)
            if "stages" in result.tables:  # a run with load stages: their rows too
                payload["stages"] = result.tables["stages"].to_dict(orient="records")
            click.echo(json_text(payload))
        else:
            click.echo(format_comparison(result, baseline))
            stages = format_stages(result)
            if stages is not None:
                click.echo("")
                click.echo(stages)
        if info is not None:
            note_missing_reuse(info)  # after the run: an error stays the only line on stderr


def _workload_and_load(
    trace: str | None, workload_text: str | None, load_text: str | None
) -> tuple[Any, Any]:
    """--workload / --load, checked (a file may hold both, as ``workload:`` and ``load:``);
    exactly one of TRACE and --workload."""
    from kvsim.workloads.spec import read_workload_and_load

    if trace is None and workload_text is None:
        raise InputError("give a TRACE, or --workload and --load")
    if trace is not None and (workload_text or load_text):
        raise InputError("give a TRACE or --workload/--load, not both")
    if workload_text is None:
        return None, None
    return read_workload_and_load(workload_text, load_text)


COMMANDS = [simulate_command]
