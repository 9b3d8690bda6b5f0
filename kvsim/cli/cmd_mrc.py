"""``kvsim mrc``: the whole LRU hit-ratio-vs-capacity curve of a trace in one pass, in
chunks, tokens and (with a model) the GiB of CPU memory to buy."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import click

from kvsim.api import mrc
from kvsim.cli.common import (
    check_output_path,
    format_option,
    model_options,
    schema_option,
    wants_progress,
)
from kvsim.cli.trace_cache_options import trace_cache_options
from kvsim.core.errors import InputError
from kvsim.core.io import atomic_write, figure_format, json_text
from kvsim.core.units import human_bytes
from kvsim.options.offload import OffloadOptions
from kvsim.options.runs import ReplayOptions

if TYPE_CHECKING:
    from kvsim.cachemode.mrc import MRC


def parse_sizes(text: str | None, option: str = "--cpu-gib") -> list[float] | None:
    """``16,64,256`` -> ``[16.0, 64.0, 256.0]`` (range checks are the sizing's)."""
    if text is None:
        return None
    sizes = []
    for part in text.split(","):
        try:
            sizes.append(float(part))
        except ValueError:
            raise InputError(f"{option}: {part.strip()!r} is not a number of GiB") from None
    return sizes


def gib_text(gib: float | None) -> str:
    """GiB to buy, rounded *up* to 0.01 so the figure given as --cpu-gib holds the chunks."""
    return "-" if gib is None else f"{math.ceil(gib * 100 - 1e-9) / 100:,.2f} GiB"


def mrc_summary(trace: str, curve: MRC) -> dict[str, Any]:
    """The flat numbers of a curve (what ``--json`` prints, with ``reach`` and ``points``)."""
    t = curve.table
    top = int(t["capacity"].max())
    return {
        "trace": trace,
        "policy": curve.info.get("policy", "lru"),
        "method": curve.info.get("method", "stack"),
        "protocol": curve.protocol,
        "sample_rate": curve.sample_rate,
        "chunk_accesses": curve.accesses,
        "sampled_accesses": curve.sampled,
        "exact_from_chunks": curve.exact_from,
        "exact_from_gib": curve.gib(curve.exact_from),
        "chunk_tokens": curve.chunk_tokens,
        "model": curve.model,
        "kv_cache_dtype": curve.kv_cache_dtype,
        "chunk_row_bytes": curve.row_bytes,
        "max_capacity": top,
        "max_capacity_gib": curve.gib(top),
        "ceiling_hit_ratio": curve.ceiling,
        "rows": len(t),
        **_miniature_summary(curve),
    }


def _miniature_summary(curve: MRC) -> dict[str, Any]:
    """A miniature curve's sampling: the rates its points used (a capacity whose miniature
    would hold fewer than ``min_chunks`` chunks is replayed at a higher rate; the table's
    ``sample_rate`` column has each point's)."""
    if curve.info.get("method") != "miniature":
        return {}
    return {
        "min_miniature_chunks": curve.info["min_chunks"],
        "min_sample_keys": curve.info["min_keys"],
        "point_sample_rates": [float(r) for r in curve.info["rates"]],
        "seeds": curve.info["seeds"],
        "forced_keys": curve.info["forced_keys"],
    }


def _records(df: Any) -> list[dict[str, Any]]:
    return list(json.loads(df.to_json(orient="records")))


def _title(summary: dict[str, Any], curve: MRC) -> str:
    if summary["method"] == "miniature":
        return (
            f"kvsim mrc ({summary['policy']}: miniature simulation at "
            f"{curve.sample_rate:g} sampling, higher where a miniature would hold under "
            f"{curve.info['min_chunks']} chunks; corrected by LRU's error on the same sample)"
        )
    return "kvsim mrc (LRU stack distances)"


def _value_text(key: str, v: Any) -> str:
    """One summary value as the text table shows it."""
    if isinstance(v, list):
        return ", ".join(f"{x:g}" for x in v)
    if key == "chunk_row_bytes":
        return f"{v:,} ({human_bytes(v)})"
    if isinstance(v, float) and key.endswith("_gib"):
        return f"{v:,.4f}"
    if isinstance(v, float) and key != "sample_rate":
        return f"{v:.4f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _text(summary: dict[str, Any], curve: MRC) -> list[str]:
    lines = [_title(summary, curve)]
    for k, v in summary.items():
        if v is not None:  # None: the GiB figures without a model
            lines.append(f"  {k:<20} {_value_text(k, v)}")
    lines.append("")
    lines.append(
        f"  {'to reach':<16} {'hit ratio':>9}  {'CPU memory':>14}  {'chunks':>11}  {'tokens':>14}"
    )
    for r in curve.reach().itertuples(index=False):
        label = f"{r.fraction_of_ceiling:.0%} of ceiling"
        if r.capacity is None or (isinstance(r.capacity, float) and math.isnan(r.capacity)):
            lines.append(f"  {label:<16} {'(no reuse: nothing can hit)':>9}")
            continue
        mark = "" if r.exact else "  ~"
        lines.append(
            f"  {label:<16} {r.hit_ratio:>9.4f}  {gib_text(curve.gib(int(r.capacity))):>14}  "
            f"{int(r.capacity):>11,}  {int(r.capacity_tokens):>14,}{mark}"
        )
    if curve.points is not None:
        lines.append("")
        lines.append(
            f"  {'--cpu-gib':<16} {'hit ratio':>9}  {'allocated':>14}  {'chunks':>11}  "
            f"{'tokens':>14}"
        )
        for p in curve.points.itertuples(index=False):
            mark = "" if p.exact else "  ~"
            lines.append(
                f"  {p.cpu_gib_asked:<16,g} {p.hit_ratio:>9.4f}  {p.cpu_gib:>10,.2f} GiB  "
                f"{int(p.capacity):>11,}  {int(p.capacity_tokens):>14,}{mark}"
            )
    if any("~" in line for line in lines):
        why = "below exact_from_chunks" if curve.sample_rate >= 1 else "sampled"
        lines.append(f"  ~ {why}: the curve's estimate, not a replay's exact value")
    return lines


@click.command("mrc")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option(
    "--policy",
    default="lru",
    show_default=True,
    help="Eviction policy: lru in one pass (stack distances); any other by miniature "
    "simulation (replays of a sampled trace on scaled caches).",
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
    default=None,
    help="Spatial sampling rate (SHARDS); 1 = exact. Default: 1 for lru, 0.1 for others.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Salt of the sampling hash.")
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Policies other than lru: average this many miniatures (salts --seed, --seed+1, "
    "...): less sampling error, proportionally slower.",
)
@format_option
@schema_option(ReplayOptions, "limit")
@schema_option(OffloadOptions, "block_tokens")
@schema_option(OffloadOptions, "chunk_tokens")
@click.option(
    "--points",
    type=click.IntRange(min=2),
    default=200,
    show_default=True,
    help="Capacities on each of the table's two grids, log and linear (up to twice as "
    "many rows, duplicates merged).",
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
@model_options
@schema_option(OffloadOptions, "gpu_block_tokens", show_default=True)
@click.option(
    "--cpu-gib",
    "--kv-offloading-size",
    "cpu_gib",
    default=None,
    metavar="GIB[,GIB...]",
    help="Also give the hit ratio at these CPU sizes (needs --model), e.g. 16,64,256.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Policies other than lru: a bar counting the miniatures' replays (default: on a "
    "terminal).",
)
@trace_cache_options
def mrc_command(
    trace: str,
    policy: str,
    protocol: str,
    sample_rate: float | None,
    seed: int,
    seeds: int,
    fmt: str | None,
    limit: int | None,
    block_tokens: int | None,
    chunk_tokens: int | None,
    points: int,
    csv_path: str | None,
    plot_path: str | None,
    model: str | None,
    tp: int | None,
    kv_cache_dtype: str | None,
    gpu_block_tokens: int,
    cpu_gib: str | None,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Hit ratio at every CPU capacity of TRACE, in one pass over it: in chunks and tokens,
    and with --model in GiB, with the infinite-cache ceiling and the CPU memory that reaches
    50 / 90 / 99 % of it.

    \b
    Example:
      kvsim mrc traces/mooncake_fast25_conversation_trace.jsonl --model llama-3.1-8b \\
          --cpu-gib 16,64,256 --csv mrc.csv --plot mrc.png
    """
    check_output_path(csv_path, "--csv", trace)
    check_output_path(plot_path, "--plot", trace, outputs={"--csv": csv_path})
    if plot_path:
        figure_format(plot_path)
    curve = mrc(
        trace,
        progress=wants_progress(progress),
        policy=policy,
        protocol=protocol,
        sample_rate=sample_rate,
        seed=seed,
        seeds=seeds,
        limit=limit,
        fmt=fmt,
        block_tokens=block_tokens,
        chunk_tokens=chunk_tokens,
        points=points,
        model=model,
        tp=1 if tp is None else tp,
        kv_cache_dtype=kv_cache_dtype or "auto",
        gpu_block_tokens=gpu_block_tokens,
        cpu_gib=parse_sizes(cpu_gib),
    )
    if csv_path:
        with atomic_write(csv_path, newline="") as f:
            curve.table.to_csv(f, index=False)
    if plot_path:
        import matplotlib

        matplotlib.use("Agg")  # the CLI only writes files
        from kvsim import plots

        title = plots.mrc_title(curve.table, trace)
        fig = plots.mrc(curve, title=title, ceiling=curve.ceiling)
        plots.save_as(fig, plot_path, option="--plot")
    summary = mrc_summary(trace, curve)
    if as_json:
        payload = {**summary, "reach": _records(curve.reach())}
        if curve.points is not None:
            payload["points"] = _records(curve.points)
        click.echo(json_text(payload))
        return
    click.echo("\n".join(_text(summary, curve)))


COMMANDS = [mrc_command]
