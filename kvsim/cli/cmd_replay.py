"""``kvsim replay``: cache-mode replay of a trace."""

from __future__ import annotations

from typing import Any

import click

from kvsim.api import replay
from kvsim.cli.common import (
    check_output_folder,
    check_output_path,
    echo_summary,
    fleet_options,
    format_option,
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
from kvsim.core.errors import InputError
from kvsim.core.input_files import referenced_files
from kvsim.core.io import output_folder
from kvsim.options.offload import OffloadOptions
from kvsim.options.runs import ReplayOptions
from kvsim.options.tiers import tier_from_shorthand
from kvsim.report.result import run_folder_receives
from kvsim.traces import as_trace


@click.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False))
@offload_options
@format_option
@schema_option(OffloadOptions, "prefill_chunk_tokens")
@schema_option(ReplayOptions, "limit")
@schema_option(ReplayOptions, "requests_csv", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write the requests table (Parquet + CSV), summary.json and config.json here, "
    "as simulate --out does.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Progress bar on stderr (default: when stderr is a terminal).",
)
@schema_option(ReplayOptions, "protocol", show_default=True)
@schema_option(ReplayOptions, "fused", "--fused/--no-fused", default=True, show_default=True)
@click.option(
    "--no-enable-prefix-caching",
    "no_prefix_caching",
    is_flag=True,
    help="vLLM's flag: no GPU prefix cache (cache mode's default; refuses --gpu-blocks > 0).",
)
@click.option(
    "--tier",
    "tiers",
    multiple=True,
    metavar="TYPE[:KEY=VALUE,...]",
    help="A secondary tier behind the CPU tier, as vLLM's TieringOffloadingSpec "
    "(repeatable, in order; replaces --vllm-config's secondary_tiers): fs, obj or example, "
    "e.g. fs, or fs:capacity=2TiB,policy=arc (a capacity is beyond vLLM, whose tiers "
    "never evict).",
)
@fleet_options
@trace_cache_options
def replay_command(
    trace: str,
    fmt: str | None,
    limit: int | None,
    requests_csv: str | None,
    out_dir: str | None,
    as_json: bool,
    show_progress: bool | None,
    vllm_config: str | None,
    protocol: str = "prefix",
    fused: bool = True,
    no_prefix_caching: bool = False,
    tiers: tuple[str, ...] = (),
    **kwargs: Any,
) -> None:
    """Replay TRACE in cache mode: requests one at a time, no timing.

    Prints prompt blocks, GPU / CPU / combined hit ratios, chunks stored, evicted and
    skipped by the store threshold, allocation failures and bytes moved; with secondary
    tiers (--tier, or vLLM's secondary_tiers) also the hits of each tier and the chunks
    promoted, cascaded and dropped.

    \b
    Example:
      kvsim replay traces/mooncake_fast25_conversation_trace.jsonl \\
          --cpu-gib 64 --model llama-3.1-8b --policy arc
    """
    options = pop_offload_kwargs(kwargs)
    options.update(pop_fleet_kwargs(kwargs))
    if no_prefix_caching:
        if options.get("gpu_blocks"):
            raise InputError(
                "--no-enable-prefix-caching turns the GPU prefix cache off; "
                f"drop --gpu-blocks {options['gpu_blocks']}"
            )
        options["gpu_blocks"] = 0
    inputs = [trace, vllm_config, tiers, options]
    check_output_path(requests_csv, "--requests-csv", *referenced_files(inputs))
    if out_dir is not None and requests_csv is not None:
        raise InputError("--out writes requests.csv itself; drop --requests-csv")
    check_output_folder(out_dir, "--out", run_folder_receives(out_dir or "."), inputs)
    if tiers:  # vLLM's secondary_tiers objects, in order
        if protocol != "prefix":
            raise InputError("--tier is for --protocol prefix (vLLM's connector)")
        options["secondary_tiers"] = [tier_from_shorthand(text) for text in tiers]
    info = as_trace(trace, fmt=fmt, block_tokens=options.get("block_tokens")).info
    with output_folder(out_dir):  # made (or refused) before the run, removed if it fails
        # other policies than kvsim's lru and arc always run the protocol, so --fused is a
        # default, not a demand
        with plugin_output_to_stderr():
            result = replay(
                trace,
                fmt=fmt,
                limit=limit,
                per_request=out_dir is not None,
                requests_csv=requests_csv,
                vllm_config=vllm_config,
                protocol=protocol,
                fused=None if fused else False,
                progress=wants_progress(show_progress),
                **options,
            )
        if out_dir is not None:
            result.save(out_dir)
            save_fleet_figure(result, out_dir)
    title = (
        "kvsim replay (cache mode)" if protocol == "prefix" else "kvsim replay (object protocol)"
    )
    echo_summary({**result.summary, "trace": trace}, as_json, title)
    note_missing_reuse(info)  # after the run: an error stays the only line on stderr


COMMANDS = [replay_command]
