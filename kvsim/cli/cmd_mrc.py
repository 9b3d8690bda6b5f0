"""``kvsim mrc``: the whole LRU hit-ratio-vs-capacity curve of a trace in one pass."""

from __future__ import annotations

import json
import os

import click

from kvsim.api import mrc
from kvsim.cli.common import check_output_path, format_option
from kvsim.io import atomic_write, figure_format


@click.command("mrc")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option(
    "--policy",
    default="lru",
    show_default=True,
    help="Only lru has a one-pass curve (stack distances); replay other policies.",
)
@click.option(
    "--protocol",
    type=click.Choice(["prefix", "object"]),
    default="prefix",
    show_default=True,
    help="prefix: vLLM's LRU in cache mode (no GPU tier); object: every chunk is a get.",
)
@click.option(
    "--sample-rate",
    type=float,
    default=1.0,
    show_default=True,
    help="SHARDS spatial sampling rate; 1 = exact.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Salt of the sampling hash.")
@format_option
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Only the first N requests."
)
@click.option("--block-tokens", type=int, default=None, help="Tokens per trace hash block.")
@click.option(
    "--chunk-tokens", type=int, default=None, help="Tokens per CPU chunk (default: one block)."
)
@click.option(
    "--points",
    type=click.IntRange(min=2),
    default=200,
    show_default=True,
    help="Capacities in the table (log and linear grid).",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the curve table.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the curve plot (png, pdf or svg).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def mrc_command(
    trace: str,
    policy: str,
    protocol: str,
    sample_rate: float,
    seed: int,
    fmt: str | None,
    limit: int | None,
    block_tokens: int | None,
    chunk_tokens: int | None,
    points: int,
    csv_path: str | None,
    plot_path: str | None,
    as_json: bool,
) -> None:
    """Hit ratio at every CPU capacity of TRACE, in one pass over it.

    \b
    Example:
      kvsim mrc traces/mooncake_fast25_conversation_trace.jsonl --csv mrc.csv --plot mrc.png
    """
    check_output_path(csv_path, "--csv", trace)
    check_output_path(plot_path, "--plot", trace, csv_path)
    if plot_path:
        figure_format(plot_path)
    curve = mrc(
        trace,
        policy=policy,
        protocol=protocol,
        sample_rate=sample_rate,
        seed=seed,
        limit=limit,
        fmt=fmt,
        block_tokens=block_tokens,
        chunk_tokens=chunk_tokens,
        points=points,
    )
    if csv_path:
        with atomic_write(csv_path, newline="") as f:
            curve.table.to_csv(f, index=False)
    if plot_path:
        from kvsim import plots

        plots.save_as(
            plots.mrc_curve(curve, title=f"LRU ({protocol}) {os.path.basename(trace)}"), plot_path
        )
    t = curve.table
    summary = {
        "trace": trace,
        "policy": "lru",
        "protocol": protocol,
        "sample_rate": sample_rate,
        "chunk_accesses": curve.accesses,
        "sampled_accesses": curve.sampled,
        "exact_from_chunks": curve.exact_from,
        "max_capacity": int(t["capacity"].max()),
        "max_hit_ratio": float(t["hit_ratio"].max()),
        "rows": len(t),
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo("kvsim mrc (LRU stack distances)")
    for k, v in summary.items():
        click.echo(f"  {k:<20} {v}")
    for q in (0.25, 0.5, 0.75, 1.0):
        row = t.iloc[min(len(t) - 1, int(q * (len(t) - 1)))]
        click.echo(f"  capacity {int(row['capacity']):>10,}  hit ratio {row['hit_ratio']:.4f}")


COMMANDS = [mrc_command]
