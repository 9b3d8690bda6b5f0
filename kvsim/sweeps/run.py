"""``kvsim.sweep``: a checked spec's cells run on an executor, each row journaled as it
comes, the results table written from every row on the way out (interrupted or not)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.core.errors import InputError
from kvsim.options.schema import short_repr
from kvsim.report.progress import Progress, ProgressArg
from kvsim.report.result import write_metadata
from kvsim.report.tables import write_table
from kvsim.sweeps.baselines import sharing_baselines
from kvsim.sweeps.cells import STATUS_COLUMNS, cell_id
from kvsim.sweeps.executors import EXECUTORS, executor
from kvsim.sweeps.inputs import trace_text
from kvsim.sweeps.journal import Journal, Warn, folder_lock, read_journal, reusable, run_keys
from kvsim.sweeps.spec import SweepSpec

if TYPE_CHECKING:
    import pandas as pd

#: ``on_row(row, finished, total)``: called after each finished cell
OnRow = Callable[[dict[str, Any], int, int], None]
#: the results table's files in an output folder: ``results.parquet`` and ``results.csv``
RESULTS = "results"


def sweep(
    spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec,
    *,
    out: str | os.PathLike[str] | None = None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    retry_failed: bool = False,
    on_row: OnRow | None = None,
    on_warning: Warn | None = None,
    progress: ProgressArg = None,
) -> pd.DataFrame:
    """Run every cell of ``spec`` and return the results table (one row per cell).

    ``executor``: ``local`` (process pool, default), ``serial`` (this process) or ``ray``
    (``address`` of a cluster, else a local Ray with ``workers`` CPUs). With ``out``, rows are
    journaled there and cells already journaled for the same trace content and kvsim version
    are not run again (``retry_failed`` re-runs the failed ones); a second sweep into a folder
    in use is refused. ``on_row(row, done, total)`` is called after each finished cell;
    ``on_warning(message)`` gets skipped journal lines (default: :mod:`warnings`).
    ``progress=True`` shows a bar counting finished cells (a widget in a notebook, lines in
    a log file); a callable is called as ``progress(n)`` as cells finish.
    """
    s = SweepSpec.load(spec)
    workers = _check_run(executor, workers)
    base_dir = os.getcwd()
    plan = _Plan.make(s, base_dir, executor, workers, address)
    with Progress(progress, len(plan.cells), "sweep", unit="cell") as bar:
        on_row = _with_progress(on_row, bar.callback)
        if out is None:
            return _execute(plan, {}, None, on_row)
        folder = os.fspath(out)
        with folder_lock(folder):
            write_metadata(folder, s.traces, dataclasses.asdict(s), command="sweep")
            journal_rows = read_journal(folder, on_warning)
            done = {
                i: r
                for i, r in journal_rows.items()
                if i in plan.keys and reusable(r, plan.keys[i], retry_failed)
            }
            return _execute(plan, done, folder, on_row)


def to_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> the results table: status columns first, then configuration, then metrics."""
    import pandas as pd

    rows = sorted(rows, key=lambda r: r["cell"])
    df = pd.DataFrame.from_records(rows)
    if df.empty:
        return pd.DataFrame(columns=list(STATUS_COLUMNS))
    first = [c for c in STATUS_COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)


def write_results(df: pd.DataFrame, folder: str | os.PathLike[str]) -> list[str]:
    """Write ``results.parquet`` and ``results.csv`` atomically; return their paths."""
    return [os.path.join(folder, name) for name in write_table(df, folder, RESULTS)]


def _check_run(name: str, workers: int | None) -> int:
    if name not in EXECUTORS:
        raise InputError(f"executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
    if workers is None:
        return os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"workers must be an integer >= 1, got {short_repr(workers)}")
    return workers


def _table_row(row: Mapping[str, Any], cell: int) -> dict[str, Any]:
    """A journal row as a results-table row (the run key stays in the journal)."""
    return {"cell": cell, **{k: v for k, v in row.items() if k not in ("cell", "run_key")}}


def _with_progress(on_row: OnRow | None, tick: Callable[[int], None] | None) -> OnRow | None:
    """``on_row`` that also moves a progress bar up to the number of finished cells
    (resumed cells included)."""
    if tick is None:
        return on_row
    shown_count = 0

    def counted(row: dict[str, Any], done: int, total: int) -> None:
        nonlocal shown_count
        tick(done - shown_count)
        shown_count = done
        if on_row is not None:
            on_row(row, done, total)

    return counted


@dataclass
class _Plan:
    """One sweep call's cells (with their ids and run keys) and where they run."""

    cells: list[dict[str, Any]]
    ids: list[str]
    keys: dict[str, str]  # cell_id -> run key
    base_dir: str
    executor: str
    workers: int
    address: str | None

    @classmethod
    def make(
        cls, s: SweepSpec, base_dir: str, name: str, workers: int, address: str | None
    ) -> _Plan:
        cells = s.cells()
        ids = [cell_id(c) for c in cells]
        if len(set(ids)) != len(ids):
            raise InputError("the sweep has duplicate cells (repeated trace or grid values)")
        by_trace = run_keys(s.traces, base_dir)
        keys = {i: by_trace[trace_text(c["trace"])] for c, i in zip(cells, ids)}
        return cls(cells, ids, keys, base_dir, name, workers, address)


def _execute(
    plan: _Plan,
    done: dict[str, dict[str, Any]],
    folder: str | None,
    on_row: OnRow | None,
) -> pd.DataFrame:
    """Run the cells not ``done``, journaling each row into ``folder`` as it comes; the
    results files are rewritten from every row on the way out, interrupted or not."""
    index = {i: n for n, i in enumerate(plan.ids)}
    rows = [_table_row(r, index[i]) for i, r in done.items()]
    todo = [c for c, i in zip(plan.cells, plan.ids) if i not in done]
    total, finished = len(plan.cells), len(rows)
    journal = Journal(folder) if folder is not None else None
    run = executor(plan.executor)
    try:
        if todo:
            workers = min(plan.workers, len(todo))
            for row in sharing_baselines(todo, run(todo, plan.base_dir, workers, plan.address)):
                row = _table_row(row, index[row["cell_id"]])
                if journal is not None:
                    journal.append({**row, "run_key": plan.keys[row["cell_id"]]})
                rows.append(row)
                finished += 1
                if on_row is not None:
                    on_row(row, finished, total)
    finally:
        if journal is not None:
            journal.close()
            if rows:
                write_results(to_frame(rows), journal.folder)
    return to_frame(rows)
