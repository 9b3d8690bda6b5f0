"""``kvsim replay``: cache-mode replay of a trace."""

from __future__ import annotations

from typing import Any

import click

from kvsim.api import replay
from kvsim.cli.common import (
    check_output_path,
    echo_summary,
    format_option,
    note_missing_reuse,
    offload_options,
    pop_offload_kwargs,
    progress_bar,
)
from kvsim.traces import as_trace


@click.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False))
@offload_options
@format_option
@click.option(
    "--prefill-chunk-tokens",
    type=int,
    default=None,
    help=(
        "Offer stores per chunked-prefill step of N tokens, as vLLM does "
        "(default: one offer per request)."
    ),
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N requests."
)
@click.option(
    "--requests-csv",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write one row per request (trace order) to this CSV.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Progress bar on stderr (default: when stderr is a terminal).",
)
@click.option(
    "--protocol",
    type=click.Choice(["prefix", "object"]),
    default="prefix",
    show_default=True,
    help="prefix: vLLM's connector; object: every chunk is a get, a miss inserts it.",
)
@click.option(
    "--fused/--no-fused",
    default=True,
    show_default=True,
    help="lru, arc: the fused one-request-at-a-time tier, or the full manager protocol "
    "(the same decisions, several times slower; for cross-checking).",
)
def replay_command(
    trace: str,
    fmt: str | None,
    limit: int | None,
    requests_csv: str | None,
    as_json: bool,
    show_progress: bool | None,
    vllm_config: str | None,
    protocol: str = "prefix",
    fused: bool = True,
    **kwargs: Any,
) -> None:
    """Replay TRACE in cache mode: requests one at a time, no timing.

    Prints prompt blocks, GPU / CPU / combined hit ratios, chunks stored, evicted and
    skipped by the store threshold, allocation failures and bytes moved.

    \b
    Example:
      kvsim replay traces/mooncake_fast25_conversation_trace.jsonl \\
          --cpu-gib 64 --model llama-3.1-8b --policy arc
    """
    options = pop_offload_kwargs(kwargs)
    check_output_path(requests_csv, "--requests-csv", trace, vllm_config)
    info = as_trace(trace, fmt=fmt, block_tokens=options.get("block_tokens")).info
    with progress_bar(show_progress, trace, limit, "replaying") as bar:
        # other policies than kvsim's lru and arc always run the protocol, so --fused is a
        # default, not a demand
        result = replay(
            trace,
            fmt=fmt,
            limit=limit,
            per_request=False,
            requests_csv=requests_csv,
            vllm_config=vllm_config,
            protocol=protocol,
            fused=None if fused else False,
            progress=bar,
            **options,
        )
    title = (
        "kvsim replay (cache mode)" if protocol == "prefix" else "kvsim replay (object protocol)"
    )
    echo_summary({**result.summary, "trace": trace}, as_json, title)
    note_missing_reuse(info)  # after the run: an error stays the only line on stderr


COMMANDS = [replay_command]
