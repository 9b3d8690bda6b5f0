"""``kvsim sweep``: a grid of runs into one results table, resumable."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import click
import yaml

from kvsim.cli.common import (
    FiniteFloatRange,
    check_output_folder,
    plugin_output_to_stderr,
    wants_progress,
)
from kvsim.cli.trace_cache_options import trace_cache_options
from kvsim.core.errors import InputError
from kvsim.core.yaml_text import load_yaml
from kvsim.options.offload import OffloadOptions
from kvsim.options.schema import field
from kvsim.sweeps import (
    EXECUTORS,
    FOLDER_FILES,
    MAX_CELLS,
    MODES,
    NO_TIERS,
    TIER_JOIN,
    TIERS,
    SweepSpec,
    check_value,
    read_journal,
    sweep,
    tier_set,
)
from kvsim.sweeps.cell_tables import CELLS

if TYPE_CHECKING:
    from kvsim.cli.common import FC

#: offload options swept from the command line; values are comma-separated lists
GRID_OPTIONS = (
    "policy",
    "admission",
    "cpu_chunks",
    "cpu_gib",
    "store_threshold",
    "gpu_blocks",
    "chunk_tokens",
    "model",
    "seed",
)


def _value(text: str) -> Any:
    """One comma-separated value as YAML reads it (``100`` a number, ``lru`` a name); text
    YAML cannot parse (``[``) stays text, for the spec check to name."""
    try:
        return load_yaml(text, "a grid option's value")
    except yaml.YAMLError:
        return text


def _values(name: str, text: str) -> list[Any]:
    """A grid option's values, each checked now (``--cpu-gib abc`` is named, not run)."""
    option = f"--{name.replace('_', '-')}"
    items = [v.strip() for v in text.split(",")]
    if not any(items):
        raise InputError(f"{option}: give at least one value")
    if not all(items):  # 100,,200: a value lost between commas is a typo, not nothing
        raise InputError(f"{option}: an empty value in {text!r}")
    values = [_value(v) for v in items]
    for value in values:
        check_value(name, value, option)
    return values


def _grid_options(f: FC) -> FC:
    """One ``--NAME V1,V2,...`` per grid option, its help text the option's own."""
    for name in reversed(GRID_OPTIONS):
        f = click.option(
            f"--{name.replace('_', '-')}",
            name,
            default=None,
            metavar="V1,V2,...",
            help=f"Sweep over these values. {field(OffloadOptions, name).description}",
        )(f)
    return f


def _spec_data(
    spec: str | None,
    traces: tuple[str, ...],
    mode: str | None,
    limit: int | None,
    grid_opts: dict[str, Any],
    tier_sets: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The sweep as a mapping: SPEC's values (if any), then the command-line options over
    them (traces add up; a grid option, ``--tier-set`` too, replaces that field's grid and
    its fixed option)."""
    data: dict[str, Any] = dataclasses.asdict(SweepSpec.load(spec)) if spec else {}
    data["traces"] = list(data.get("traces", [])) + list(traces)
    if mode:
        data["mode"] = mode
    if limit:
        data["limit"] = limit
    grid = data.setdefault("grid", {})
    options = data.setdefault("options", {})
    for name, text in grid_opts.items():
        if text is not None:
            grid[name] = _values(name, text)
            options.pop(name, None)
    if tier_sets:
        for text in tier_sets:
            tier_set(text, "--tier-set")  # each named now, before any cell runs
        grid[TIERS] = list(tier_sets)
        options.pop(TIERS, None)
    return data


def _warn(message: str) -> None:
    click.echo(f"kvsim: warning: {message}", err=True)


@click.command("sweep")
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--trace",
    "traces",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A trace to sweep (repeatable); adds to the spec's traces.",
)
@click.option("--mode", type=click.Choice(MODES), default=None, help="cache (default) or timed.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Requests per trace.")
@_grid_options
@click.option(
    "--tier-set",
    "tier_sets",
    multiple=True,
    metavar="TIERS",
    help=f"Sweep the secondary tiers behind the CPU tier (repeatable, one tier set each): "
    f"{NO_TIERS!r}, or tiers joined by {TIER_JOIN!r}, each TYPE[:KEY=VALUE,...] as kvsim "
    "replay --tier (fs, obj or example; capacity=, chunks=, policy= are beyond vLLM), e.g. "
    "--tier-set none --tier-set fs:capacity=1TiB --tier-set fs:capacity=1TiB+obj. Rows get "
    "a 'tiers' column and each tier's hit share: cpu_tier_hit_ratio, tier1_fs_hit_ratio, "
    "..., secondary_tier_hit_ratio (all secondary tiers); in a timed sweep "
    "tier1_fs_hit_share, ..., secondary_tier_hit_share and combined_hit_share.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="Results folder (journal.jsonl, results.parquet, results.csv, metadata.json, and "
    "cells/ with --keep-requests); default sweep-NAME.",
)
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    default="local",
    show_default=True,
    help="local process pool, serial (this process) or a Ray cluster.",
)
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="Parallel cells (default: CPUs)."
)
@click.option("--address", default=None, help="Ray cluster address (with --executor ray).")
@click.option("--retry-failed", is_flag=True, help="Re-run cells that failed in an earlier run.")
@click.option(
    "--fresh",
    is_flag=True,
    help="Run every cell again: start a new journal in --out instead of resuming it.",
)
@click.option(
    "--keep-requests",
    is_flag=True,
    default=False,
    help="Keep each cell's requests table as OUT/cells/CELL_ID/requests.parquet (CELL_ID: "
    "the results' cell_id column), for kvsim plot OUT --kind ttft-cdf and "
    "kvsim.sweeps.read_requests(OUT): the rows kvsim simulate writes for a timed cell, "
    "kvsim replay --requests-csv for a cache cell (hits per request, no times). Spec key: "
    "keep_requests: true. Resuming runs again the cells whose table is missing.",
)
@click.option(
    "--max-cells",
    type=click.IntRange(min=1),
    default=MAX_CELLS,
    show_default=True,
    help="Refuse a sweep of more cells than this (counted before any runs).",
)
@click.option(
    "--cell-timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Record a cell still running after this many seconds as failed and go on "
    "(local executor; default: no limit).",
)
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Progress bar on stderr, counting cells (default: when stderr is a terminal).",
)
@trace_cache_options
def sweep_command(
    spec: str | None,
    traces: tuple[str, ...],
    mode: str | None,
    limit: int | None,
    out: str | None,
    executor: str,
    workers: int | None,
    address: str | None,
    retry_failed: bool,
    fresh: bool,
    keep_requests: bool,
    max_cells: int,
    cell_timeout: float | None,
    show_progress: bool | None,
    tier_sets: tuple[str, ...],
    **grid_opts: Any,
) -> int:
    """Run every combination of traces x grid values from SPEC (YAML) and/or the options.

    One row per cell (configuration + metrics) in OUT/results.parquet and .csv. The whole
    spec is checked before any cell runs (exit status 2 naming the bad key). A failing
    cell is recorded with its error and the sweep goes on (exit status 1 if any failed);
    re-running the same command resumes where it stopped (cells whose trace changed run
    again). One sweep at a time per OUT.

    \b
    Examples:
      kvsim sweep examples/sweep_small.yaml --out sweep_small
      kvsim sweep --trace traces/samples/mooncake_small.jsonl --policy lru,arc \\
          --cpu-chunks 100,400,1600 --out sweep_cli
      kvsim sweep --trace traces/mooncake_fast25_conversation_trace.jsonl \\
          --cpu-gib 16,64,256 --tier-set none --tier-set fs:capacity=1TiB --out sweep_tiers
    """
    data = _spec_data(spec, traces, mode, limit, grid_opts, tier_sets)
    if keep_requests:
        data["keep_requests"] = True
    if not data["traces"]:
        raise InputError("give a SPEC file or at least one --trace")
    s = SweepSpec.from_mapping(data, source=spec or "kvsim sweep")
    if address and executor != "ray":
        raise InputError("--address is for --executor ray")
    out = out or f"sweep-{s.name}"
    inputs = [spec, s.traces, s.options, s.grid]
    check_output_folder(out, "--out", FOLDER_FILES.__contains__, inputs, {CELLS})
    failed: list[str] = []
    warned: list[str] = []

    def on_row(row: dict[str, Any], done: int, n: int) -> None:
        if row["status"] != "ok":
            failed.append(f"cell {row['cell']}: {row['error']}")
        for line in (row.get("warnings") or "").splitlines():
            warned.append(f"cell {row['cell']} ({cell_label(row, s.grid)}): {line}")

    with plugin_output_to_stderr(), _resumable(out, s.n_cells):
        df = sweep(
            s,
            out=out,
            executor=executor,
            workers=workers,
            address=address,
            retry_failed=retry_failed,
            on_row=on_row,
            on_warning=_warn,
            progress=wants_progress(show_progress),
            max_cells=max_cells,
            cell_timeout=cell_timeout,
            fresh=fresh,
        )
    n_err = int((df["status"] != "ok").sum()) if len(df) else 0
    for line in warned:
        click.echo(f"kvsim: warning: {line}", err=True)
    for line in failed:
        click.echo(f"kvsim: failed {line}", err=True)
    resumed = int(df.attrs.get("from_journal", 0))
    ran = f"; {len(df) - resumed} run" if resumed else ""
    click.echo(
        f"{len(df)} cells ({len(df) - n_err} ok, {n_err} failed{ran}) -> "
        f"{os.path.join(out, 'results.parquet')}, {os.path.join(out, 'results.csv')}"
    )
    if resumed:
        click.echo(
            f"{resumed} of them from the journal in {out} (unchanged inputs, same kvsim); "
            "--fresh runs every cell again"
        )
    if n_err:
        click.get_current_context().exit(1)
    return 0


@contextlib.contextmanager
def _resumable(out: str, total: int) -> Iterator[None]:
    """An interrupted sweep says what it kept and how to go on, in one line (exit 130):
    the finished cells are journaled and in the results files (counted there: what is on
    disk), and the same command resumes after them."""
    try:
        yield
    except KeyboardInterrupt:
        kept = len(read_journal(out, lambda _: None))
        click.echo(
            f"kvsim: interrupted after {kept} of {total} cells; they are in "
            f"{os.path.join(out, 'results.parquet')} and the journal: the same command "
            "resumes",
            err=True,
        )
        raise click.exceptions.Exit(130) from None


def cell_label(row: Mapping[str, Any], grid: Mapping[str, Any]) -> str:
    """A cell's name in a message: its trace and the value of each grid key."""
    parts = [f"trace={row.get('trace')}"] + [f"{k}={row.get(k)}" for k in grid]
    return ", ".join(parts)


COMMANDS = [sweep_command]
