"""A sweep's cells: the grid expanded (lazily, counted before any is built), each cell's
stable id, and running one cell into one row.

A *cell* is a plain dict (``trace``, ``mode``, ``limit`` and option fields); :func:`run_cell`
is a pure function of it and of the trace's content, so a row is the same on a process pool,
on Ray, or run alone (``elapsed_s`` aside).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kvsim.core.errors import InputError, InputWarning
from kvsim.sweeps.baselines import baseline_key, timed_run
from kvsim.sweeps.cell_tables import write_requests
from kvsim.sweeps.inputs import resolve_trace, trace_label
from kvsim.sweeps.spec_schema import CELL_KEYS
from kvsim.sweeps.tier_sets import TIERS, secondary_tiers, tier_set_label, tier_shares

if TYPE_CHECKING:
    import pandas as pd

#: a row's first columns, before its configuration and metrics
STATUS_COLUMNS = ("cell", "cell_id", "status", "error", "elapsed_s")


def count_cells(traces: list[Any], grid: Mapping[str, list[Any]]) -> int:
    """How many cells :func:`expand` yields, without building one."""
    return len(traces) * math.prod(len(values) for values in grid.values())


def expand(
    traces: list[Any],
    mode: str,
    limit: int | None,
    options: Mapping[str, Any],
    grid: Mapping[str, list[Any]],
) -> Iterator[dict[str, Any]]:
    """Every cell, traces outermost, grid axes in the order given (the last one fastest).

    Args:
        traces: trace entries (paths or generator mappings).
        mode: ``cache`` or ``timed``.
        limit: requests per trace, or None.
        options: fixed option values, in every cell.
        grid: option -> its values; no name in both ``options`` and ``grid``.

    Returns:
        an iterator of :func:`count_cells` new dicts (``trace``, ``mode``, ``limit``, the
        options, then the grid's values).
    """
    axes = list(grid)
    for trace in traces:
        for values in itertools.product(*(grid[a] for a in axes)):
            yield {
                "trace": trace,
                "mode": mode,
                "limit": limit,
                **options,
                **dict(zip(axes, values)),
            }


def cell_id(cell: Mapping[str, Any]) -> str:
    """A stable hash of a cell's configuration (what resume matches on, with the run key)."""
    text = json.dumps(cell, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def run_cell(
    cell: Mapping[str, Any], base_dir: str | None = None, requests_dir: str | None = None
) -> dict[str, Any]:
    """Run one cell; never raises: a failure becomes ``status="error"`` with its message.

    Relative trace paths are read from ``base_dir`` (the driver's working directory), which is
    not part of the configuration. With ``requests_dir`` (a sweep folder) the cell's requests
    table is written there (:mod:`kvsim.sweeps.cell_tables`) before the row is returned.
    """
    start = time.perf_counter()
    cell = dict(cell)
    row = config_row(cell)
    options = {k: v for k, v in cell.items() if k not in (*CELL_KEYS, TIERS)}
    try:
        if TIERS in cell:
            options.update(secondary_tiers(cell[TIERS], "vllm_config" in options))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            metrics, requests = _run(cell, options, base_dir, requests_dir is not None)
        row["warnings"] = _said(caught)
        if requests_dir is not None:
            if requests is None:
                raise RuntimeError("the run kept no requests table")
            write_requests(requests_dir, row["cell_id"], requests)
        metrics.pop("trace", None)
        if TIERS in cell:
            metrics.update(tier_shares(metrics))
        for k, v in metrics.items():
            if k not in row and _scalar(v):
                row[k] = v
        row.update(status="ok", error=None)
    except Exception as e:
        # where a fault of kvsim's was raised; bad input's message names what is wrong
        tb = [] if isinstance(e, InputError) else traceback.extract_tb(e.__traceback__)
        where = f" [{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        row.update(status="error", error=f"{type(e).__name__}: {e}{where}")
    row["elapsed_s"] = time.perf_counter() - start
    return row


def _said(caught: list[warnings.WarningMessage]) -> str | None:
    """kvsim's warnings of one cell, each once, one per line, for the driver to print with
    the cell's name (in a worker they would print without it, or not at all); any other
    warning is passed on as it came."""
    said: dict[str, None] = {}
    for w in caught:
        if issubclass(w.category, InputWarning):
            said[str(w.message)] = None
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return "\n".join(said) or None


def _run(
    cell: dict[str, Any], options: dict[str, Any], base_dir: str | None, keep: bool
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """The cell's summary, and its requests table when ``keep``."""
    trace = resolve_trace(cell["trace"], base_dir)
    limit = cell.get("limit")
    if cell.get("mode", "cache") == "cache":
        from kvsim.api import replay

        result = replay(trace, limit=limit, per_request=keep, **options)
    else:
        result = timed_run(trace, limit, options, lambda: baseline_key(cell, base_dir))
    return dict(result.summary), result.tables.get("requests") if keep else None


def failed_row(cell: Mapping[str, Any], error: str) -> dict[str, Any]:
    """The row of a cell that did not finish in its worker (the cell function never raises)."""
    return {
        **config_row(cell),
        "status": "error",
        "error": f"worker failed: {error}",
        "elapsed_s": math.nan,
    }


def config_row(cell: Mapping[str, Any]) -> dict[str, Any]:
    """A row's configuration columns: the cell, with readable labels for the trace and the
    tier set."""
    row = {"cell_id": cell_id(cell), **cell, "trace": trace_label(cell["trace"])}
    if TIERS in cell:
        row[TIERS] = tier_set_label(cell[TIERS])
    return row


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))
