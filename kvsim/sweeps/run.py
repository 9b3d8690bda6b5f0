"""``kvsim.sweep``: a checked spec's cells run on an executor, each row journaled as it
comes, the results table written from every row on the way out (interrupted or not)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.core.errors import InputError
from kvsim.core.input_files import referenced_files
from kvsim.core.io import refuse_filling_folder
from kvsim.core.processes import check_workers
from kvsim.options.schema import short_repr
from kvsim.report.progress import Progress, ProgressArg
from kvsim.report.result import METADATA, write_metadata
from kvsim.report.tables import write_table
from kvsim.sweeps.baselines import sharing_baselines
from kvsim.sweeps.cell_tables import CELLS, drop_requests, has_requests
from kvsim.sweeps.cells import STATUS_COLUMNS, cell_id
from kvsim.sweeps.executors import EXECUTORS, check_timeout, executor, import_ray
from kvsim.sweeps.inputs import check_traces
from kvsim.sweeps.journal import (
    JOURNAL,
    LOCK,
    Journal,
    RunKeys,
    Warn,
    folder_lock,
    read_journal,
    reusable,
)
from kvsim.sweeps.spec import SweepSpec

if TYPE_CHECKING:
    import pandas as pd

#: ``on_row(row, finished, total)``: called after each finished cell
OnRow = Callable[[dict[str, Any], int, int], None]
#: the results table's files in an output folder: ``results.parquet`` and ``results.csv``
RESULTS = "results"
#: every file a sweep's output folder receives (none of them may be an input of the sweep);
#: ``cells`` holds each cell's requests table (``keep_requests``)
FOLDER_FILES = frozenset({JOURNAL, LOCK, METADATA, f"{RESULTS}.parquet", f"{RESULTS}.csv", CELLS})
#: the most cells a sweep runs unless told otherwise (``max_cells``, ``--max-cells``)
MAX_CELLS = 100_000


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
    max_cells: int | None = MAX_CELLS,
    cell_timeout: float | None = None,
    fresh: bool = False,
) -> pd.DataFrame:
    """Run every cell of ``spec`` and return the results table (one row per cell).

    ``executor``: ``local`` (process pool, default), ``serial`` (this process) or ``ray``
    (``address`` of a cluster, else a local Ray with ``workers`` CPUs). With ``out``, rows are
    journaled there and cells already journaled under the same run key (the content of every
    file the cell reads, and kvsim's version: :class:`~kvsim.sweeps.journal.RunKeys`) are not
    run again (``retry_failed`` re-runs the failed ones); a second sweep into a folder in use
    is refused, and so is a folder where the sweep would overwrite one of its inputs.
    ``on_row(row, done, total)`` is called after each finished cell; ``on_warning(message)``
    gets skipped journal lines (default: :mod:`warnings`). ``progress=True`` shows a bar
    counting finished cells (a widget in a notebook, lines in a log file); a callable is
    called as ``progress(n)`` as cells finish. A sweep of more than ``max_cells`` cells
    (counted before any is built; None: no limit) is refused. ``cell_timeout`` (seconds; the
    ``local`` executor) records a cell that runs longer as failed and goes on. ``fresh``
    runs every cell again, starting a new journal in ``out``. The table's
    ``attrs["from_journal"]`` counts the rows taken from the journal instead of run.

    A spec with ``keep_requests: true`` (it needs ``out``) keeps each cell's requests table
    in ``out/cells/CELL_ID/requests.parquet`` (read them back with
    :func:`~kvsim.sweeps.cell_tables.read_requests`); a journaled cell whose table is
    missing runs again. With a Ray cluster, ``out`` must be on storage every node shares.
    """
    for name, hook in (("on_row", on_row), ("on_warning", on_warning), ("progress", progress)):
        if hook is not None and not isinstance(hook, bool) and not callable(hook):
            raise InputError(f"{name} must be a function (or None), got {short_repr(hook)}")
    s = SweepSpec.load(spec)
    if s.keep_requests and out is None:
        raise InputError("keep_requests needs an output folder (out=..., kvsim sweep --out)")
    workers = _check_run(executor, workers)
    _check_size(s, max_cells)
    check_timeout(cell_timeout, executor)
    base_dir = os.getcwd()
    if out is not None:
        inputs = referenced_files([s.traces, s.options, s.grid, _spec_path(spec)], base_dir)
        refuse_filling_folder("out", out, FOLDER_FILES.__contains__, inputs, {CELLS})
    if "block_tokens" in s.options:
        block_tokens = [s.options["block_tokens"]]
    else:
        block_tokens = list(s.grid.get("block_tokens", [None]))
    check_traces(s.traces, base_dir, s.limit, block_tokens)
    plan = _Plan(s, base_dir, executor, workers, address, cell_timeout)
    if s.keep_requests and out is not None:
        plan.requests_dir = os.path.abspath(out)
    with Progress(progress, s.n_cells, "sweep", unit="cell") as bar:
        on_row = _with_progress(on_row, bar.callback)
        if out is None:
            return _execute(plan, {}, None, on_row)
        folder = os.fspath(out)
        with folder_lock(folder):
            write_metadata(folder, s.traces, dataclasses.asdict(s), command="sweep")
            if fresh:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, JOURNAL))
            journal_rows = read_journal(folder, on_warning)
            done = _reusable(plan, journal_rows, retry_failed)
            df = _execute(plan, done, folder, on_row)
            df.attrs["from_journal"] = len(done)
            return df


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
    if name == "ray":
        import_ray()
    return check_workers(workers)


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


def _spec_path(spec: Any) -> str | None:
    return os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else None


def _check_size(s: SweepSpec, max_cells: int | None) -> None:
    """Refuse a grid larger than ``max_cells`` before building any cell (a repeated trace
    or grid value was refused when the spec was read, naming its file)."""
    n = s.n_cells
    if max_cells is not None and n > max_cells:
        raise InputError(
            f"the sweep has {n:,} cells, more than the limit of {max_cells:,}; "
            "shrink the grid or raise the limit (kvsim sweep --max-cells N)"
        )


@dataclass
class _Plan:
    """One sweep call's cells (built lazily, each with its id and run key) and where they
    run."""

    spec: SweepSpec
    base_dir: str
    executor: str
    workers: int
    address: str | None
    cell_timeout: float | None = None
    #: the sweep folder that keeps each cell's requests table, or None
    requests_dir: str | None = None
    keys: RunKeys = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.keys = RunKeys(self.base_dir)

    def cells(self) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """``(index, cell id, cell)`` of every cell, one at a time."""
        for n, cell in enumerate(self.spec.iter_cells()):
            yield n, cell_id(cell), cell


def _reusable(
    plan: _Plan, journal_rows: dict[str, dict[str, Any]], retry_failed: bool
) -> dict[str, tuple[int, dict[str, Any]]]:
    """The journal's rows that stand for a cell of this sweep: cell id -> (index, row); a
    successful cell whose requests table the sweep keeps but cannot find is not one."""
    if not journal_rows:
        return {}
    done = {}
    keep = plan.requests_dir
    for n, i, cell in plan.cells():
        row = journal_rows.get(i)
        if row is None or not reusable(row, plan.keys.key(cell), retry_failed):
            continue
        if keep and row.get("status") == "ok" and not has_requests(keep, i):
            continue
        done[i] = (n, row)
    return done


def _execute(
    plan: _Plan,
    done: dict[str, tuple[int, dict[str, Any]]],
    folder: str | None,
    on_row: OnRow | None,
) -> pd.DataFrame:
    """Run the cells not ``done``, journaling each row into ``folder`` as it comes; the
    results files are rewritten from every row on the way out, interrupted or not."""
    rows = [_table_row(r, n) for n, r in done.values()]
    index: dict[str, int] = {}  # the cells handed out and not yet back: id -> index
    keys: dict[str, str] = {}

    def todo() -> Iterator[dict[str, Any]]:
        for n, i, cell in plan.cells():
            if i in done:
                continue
            index[i] = n
            if folder is not None:
                keys[i] = plan.keys.key(cell)
            yield cell

    total = plan.spec.n_cells
    journal = Journal(folder) if folder is not None else None
    run = executor(plan.executor)
    timed_baselines = plan.spec.mode == "timed" and _any_baseline(plan.spec)
    try:
        if len(rows) < total:
            workers = min(plan.workers, total - len(rows))
            results = run(
                todo(),
                plan.base_dir,
                workers,
                plan.address,
                plan.cell_timeout,
                plan.requests_dir,
            )
            for row in sharing_baselines(timed_baselines, results):
                cid = row["cell_id"]
                if folder is not None and (plan.requests_dir is None or row["status"] != "ok"):
                    drop_requests(folder, cid)  # an earlier run's table is not this row's
                row = _table_row(row, index.pop(cid))
                if journal is not None:
                    journal.append({**row, "run_key": keys.pop(cid)})
                rows.append(row)
                if on_row is not None:
                    on_row(row, len(rows), total)
    finally:
        if journal is not None:
            journal.close()
            if rows:
                write_results(to_frame(rows), journal.folder)
    return to_frame(rows)


def _any_baseline(s: SweepSpec) -> bool:
    return bool(s.options.get("baseline")) or any(s.grid.get("baseline", []))
