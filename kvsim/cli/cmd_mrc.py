"""``kvsim mrc``: the whole LRU hit-ratio-vs-capacity curve of a trace in one pass."""

from __future__ import annotations

import json
import os

import click

from kvsim.api import as_trace
from kvsim.cli.common import check_output_path
from kvsim.errors import InputError
from kvsim.io import atomic_path, atomic_write
from kvsim.keys import KeyLayout
from kvsim.mrc import MRC, lru_mrc


def save_plot(mrc: MRC, path: str, title: str) -> None:
    """Hit ratio against capacity (log x axis), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = mrc.table
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(t["capacity"], t["hit_ratio"], drawstyle="steps-post")
    if mrc.protocol == "prefix" and mrc.exact_from > 1:
        ax.axvline(mrc.exact_from, color="grey", linestyle=":", label=f"exact from {mrc.exact_from}")
        ax.legend(loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel("CPU capacity (chunks)")
    ax.set_ylabel("CPU hit ratio" if mrc.protocol == "prefix" else "hit ratio")
    ax.set_ylim(0, max(0.05, float(t["hit_ratio"].max()) * 1.1))
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    ext = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=ext)
    plt.close(fig)


@click.command("mrc")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--policy", default="lru", show_default=True,
              help="Only lru has a one-pass curve (stack distances); replay other policies.")
@click.option("--protocol", type=click.Choice(["prefix", "object"]), default="prefix", show_default=True,
              help="prefix: vLLM's LRU in cache mode (no GPU tier); object: every chunk is a get.")
@click.option("--sample-rate", type=float, default=1.0, show_default=True,
              help="SHARDS spatial sampling rate; 1 = exact.")
@click.option("--seed", type=int, default=0, show_default=True, help="Salt of the sampling hash.")
@click.option("--format", "fmt", type=click.Choice(["mooncake", "bailian", "azure", "native"]), default=None,
              help="Trace format (default: detected).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N requests.")
@click.option("--block-tokens", type=int, default=None, help="Tokens per trace hash block.")
@click.option("--chunk-tokens", type=int, default=None, help="Tokens per CPU chunk (default: one block).")
@click.option("--points", type=click.IntRange(min=2), default=200, show_default=True,
              help="Capacities in the table (log and linear grid).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None, help="Write the curve table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write the curve plot (png, pdf or svg).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def mrc_command(trace: str, policy: str, protocol: str, sample_rate: float, seed: int, fmt: str | None,
                limit: int | None, block_tokens: int | None, chunk_tokens: int | None, points: int,
                csv_path: str | None, plot_path: str | None, as_json: bool) -> None:
    """Hit ratio at every CPU capacity of TRACE, in one pass over it.

    \b
    Example:
      kvsim mrc traces/mooncake_fast25_conversation_trace.jsonl --csv mrc.csv --plot mrc.png
    """
    if policy.lower() != "lru":
        raise InputError(f"--policy: a one-pass curve needs a stack policy; only lru has one "
                         f"(got {policy!r}); sweep capacities with kvsim replay for others")
    check_output_path(csv_path, "--csv")
    check_output_path(plot_path, "--plot")
    tr = as_trace(trace, fmt=fmt, block_tokens=block_tokens, limit=limit)
    bt = block_tokens or tr.block_tokens
    layout = KeyLayout(bt, chunk_tokens or bt)
    curve = lru_mrc(tr, layout, protocol=protocol, sample_rate=sample_rate, seed=seed, points=points)
    if csv_path:
        with atomic_write(csv_path, newline="") as f:
            curve.table.to_csv(f, index=False)
    if plot_path:
        save_plot(curve, plot_path, f"LRU ({protocol}) {os.path.basename(trace)}")
    t = curve.table
    summary = {
        "trace": trace, "policy": "lru", "protocol": protocol, "sample_rate": sample_rate,
        "chunk_accesses": curve.accesses, "sampled_accesses": curve.sampled,
        "exact_from_chunks": curve.exact_from, "max_capacity": int(t["capacity"].max()),
        "max_hit_ratio": float(t["hit_ratio"].max()), "rows": len(t),
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
