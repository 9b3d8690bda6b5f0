"""Sweeps: traces x options grid -> one tidy table, one row per cell.

A *cell* is a plain dict (``trace``, ``mode``, ``limit`` and option fields); :func:`run_cell`
is a pure function of it, so a row is the same on a process pool, on Ray, or run alone
(``elapsed_s`` aside). With an output folder each finished row is appended to
``journal.jsonl`` and flushed at once; ``results.parquet`` and ``results.csv`` are rewritten
atomically from the journal. Re-running the same sweep into the same folder skips every cell
whose ``cell_id`` (a hash of its configuration) is already in the journal.

Spec (YAML or a mapping)::

    mode: cache                  # or timed
    traces: [traces/samples/mooncake_small.jsonl, {kind: chat, n_requests: 500, seed: 1}]
    limit: 200                   # optional, requests per trace
    options: {model: llama-3.1-8b}            # fixed for every cell
    grid: {policy: [lru, arc], cpu_chunks: [100, 400, 1600], store_threshold: [0, 2]}
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvsim.errors import InputError
from kvsim.io import atomic_path

MODES = ("cache", "timed")
EXECUTORS = ("local", "serial", "ray")
JOURNAL = "journal.jsonl"
SPEC_KEYS = {"name", "mode", "traces", "limit", "options", "grid"}
STATUS_COLUMNS = ("cell", "cell_id", "status", "error", "elapsed_s")


@dataclass
class SweepSpec:
    """A validated sweep: the cells are the product of traces and the grid, in order."""

    traces: list[Any]
    mode: str = "cache"
    limit: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    name: str = "sweep"

    @classmethod
    def load(cls, spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec) -> SweepSpec:
        if isinstance(spec, SweepSpec):
            return spec
        if isinstance(spec, (str, os.PathLike)):
            import yaml

            try:
                with open(spec) as f:
                    data = yaml.safe_load(f)
            except FileNotFoundError:
                raise InputError("sweep spec not found", source=os.fspath(spec)) from None
            except yaml.YAMLError as e:
                raise InputError(f"bad YAML: {e}", source=os.fspath(spec)) from None
            if not isinstance(data, dict):
                raise InputError("a sweep spec is a YAML mapping", source=os.fspath(spec))
            return cls.from_mapping(data)
        return cls.from_mapping(spec)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SweepSpec:
        unknown = sorted(set(data) - SPEC_KEYS)
        if unknown:
            raise InputError(
                f"unknown sweep spec key(s): {', '.join(unknown)}; "
                f"known: {', '.join(sorted(SPEC_KEYS))}"
            )
        traces = data.get("traces")
        if isinstance(traces, (str, dict)):
            traces = [traces]
        if not traces:
            raise InputError("a sweep needs at least one trace ('traces:')")
        mode = data.get("mode", "cache")
        if mode not in MODES:
            raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        grid = {
            k: (list(v) if isinstance(v, (list, tuple)) else [v])
            for k, v in (data.get("grid") or {}).items()
        }
        for k, v in grid.items():
            if not v:
                raise InputError(f"grid axis {k!r} is empty")
        options = dict(data.get("options") or {})
        clash = sorted(set(options) & set(grid))
        if clash:
            raise InputError(f"option(s) both fixed and swept: {', '.join(clash)}")
        reserved = sorted(
            (set(options) | set(grid)) & ({"trace", "mode", "limit"} | set(STATUS_COLUMNS))
        )
        if reserved:
            raise InputError(f"reserved name(s) in options/grid: {', '.join(reserved)}")
        limit = data.get("limit")
        return cls(
            traces=list(traces),
            mode=mode,
            limit=None if limit is None else int(limit),
            options=options,
            grid=grid,
            name=str(data.get("name", "sweep")),
        )

    def cells(self) -> list[dict[str, Any]]:
        """Every cell's configuration, traces outermost, grid axes in spec order."""
        axes = list(self.grid)
        out = []
        for trace in self.traces:
            for values in itertools.product(*(self.grid[a] for a in axes)):
                cell = {
                    "trace": trace,
                    "mode": self.mode,
                    "limit": self.limit,
                    **self.options,
                    **dict(zip(axes, values)),
                }
                out.append(cell)
        return out


def cell_id(cell: Mapping[str, Any]) -> str:
    """A stable hash of a cell's configuration (what resume matches on)."""
    text = json.dumps(cell, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _trace_label(trace: Any) -> str:
    if isinstance(trace, Mapping):
        from kvsim.traces.synthetic import WorkloadSpec

        return WorkloadSpec.from_mapping(trace).label()
    return str(trace)


def _resolve_trace(trace: Any, base_dir: str | None) -> Any:
    if isinstance(trace, Mapping):
        from kvsim.traces.synthetic import WorkloadSpec

        return WorkloadSpec.from_mapping(trace).requests()
    path = os.fspath(trace)
    if base_dir and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    return path


def _metrics(mode: str, trace: Any, limit: int | None, options: dict[str, Any]) -> dict[str, Any]:
    if mode == "cache":
        from kvsim.api import replay

        return dict(replay(trace, limit=limit, per_request=False, **options).summary)
    try:
        from kvsim.api import simulate
    except ImportError as e:
        raise RuntimeError(f"timed mode is not available in this kvsim build ({e})") from None
    return dict(simulate(trace, limit=limit, **options).summary)


def run_cell(cell: Mapping[str, Any], base_dir: str | None = None) -> dict[str, Any]:
    """Run one cell; never raises: a failure becomes ``status="error"`` with its message.

    Relative trace paths are read from ``base_dir`` (the driver's working directory), which is
    not part of the configuration.
    """
    start = time.perf_counter()
    cell = dict(cell)
    row: dict[str, Any] = {"cell_id": cell_id(cell), **cell, "trace": _trace_label(cell["trace"])}
    options = {k: v for k, v in cell.items() if k not in ("trace", "mode", "limit")}
    try:
        metrics = _metrics(
            cell.get("mode", "cache"),
            _resolve_trace(cell["trace"], base_dir),
            cell.get("limit"),
            options,
        )
        metrics.pop("trace", None)
        for k, v in metrics.items():
            if k not in row and _scalar(v):
                row[k] = v
        row.update(status="ok", error=None)
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" [{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        row.update(status="error", error=f"{type(e).__name__}: {e}{where}")
    row["elapsed_s"] = time.perf_counter() - start
    return row


def _failed_row(cell: Mapping[str, Any], exc: BaseException) -> dict[str, Any]:
    """The row of a cell whose worker died (the cell function itself never raises)."""
    return {
        "cell_id": cell_id(cell),
        **cell,
        "trace": _trace_label(cell["trace"]),
        "status": "error",
        "error": f"worker failed: {type(exc).__name__}: {exc}",
        "elapsed_s": math.nan,
    }


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


# --------------------------------------------------------------------------- executors


def _run_serial(
    cells: list[dict[str, Any]], base_dir: str, workers: int, address: str | None
) -> Iterator[dict[str, Any]]:
    for c in cells:
        yield run_cell(c, base_dir)


def _run_local(
    cells: list[dict[str, Any]], base_dir: str, workers: int, address: str | None
) -> Iterator[dict[str, Any]]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=workers)
    finished = False
    try:
        of = {pool.submit(run_cell, c, base_dir): c for c in cells}
        for fut in as_completed(of):
            exc = fut.exception()
            yield _failed_row(of[fut], exc) if exc is not None else fut.result()
        finished = True
    finally:  # interrupted: drop queued cells, do not wait for running ones
        pool.shutdown(wait=finished, cancel_futures=True)


def _run_ray(
    cells: list[dict[str, Any]], base_dir: str, workers: int, address: str | None
) -> Iterator[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise InputError("the ray executor needs Ray: pip install 'kvsim[ray]'") from None
    started = False
    if not ray.is_initialized():
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        kwargs: dict[str, Any] = {
            "runtime_env": {"env_vars": {"PYTHONPATH": path}},
            "include_dashboard": False,
            "log_to_driver": False,
        }
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=workers, **kwargs)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(run_cell)
        of = {remote.remote(c, base_dir): c for c in cells}
        pending = list(of)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    row = ray.get(ref)
                except ray.exceptions.RayError as e:
                    row = _failed_row(of[ref], e)
                yield row
    finally:
        if started:
            ray.shutdown()


_EXECUTORS: dict[str, Callable[..., Iterator[dict[str, Any]]]] = {
    "serial": _run_serial,
    "local": _run_local,
    "ray": _run_ray,
}


# --------------------------------------------------------------------------- journal


def read_journal(folder: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """cell_id -> row from ``folder/journal.jsonl``.

    A torn last line (a kill mid-write) is dropped."""
    path = os.path.join(folder, JOURNAL)
    rows: dict[str, dict[str, Any]] = {}
    if not os.path.exists(path):
        return rows
    with open(path, "rb") as f:
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):  # cut the torn tail so later appends start on a fresh line
        with open(path, "r+b") as f:
            f.truncate(len(complete))
    for line in complete.splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["cell_id"]] = row  # a later line (a retried cell) wins
    return rows


class _Journal:
    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.f = open(os.path.join(folder, JOURNAL), "a", encoding="utf-8")  # noqa: SIM115

    def append(self, row: dict[str, Any]) -> None:
        self.f.write(json.dumps(row, default=_json_default, allow_nan=True) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


def _json_default(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return str(v)


def to_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> the results table: status columns first, then configuration, then metrics."""
    rows = sorted(rows, key=lambda r: r["cell"])
    df = pd.DataFrame.from_records(rows)
    if df.empty:
        return pd.DataFrame(columns=list(STATUS_COLUMNS))
    first = [c for c in STATUS_COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)


def write_results(df: pd.DataFrame, folder: str | os.PathLike[str]) -> list[str]:
    """Write ``results.parquet`` and ``results.csv`` atomically; return their paths."""
    out = []
    pq = os.path.join(folder, "results.parquet")
    with atomic_path(pq) as tmp:
        _parquet_safe(df).to_parquet(tmp, index=False)
    out.append(pq)
    csv = os.path.join(folder, "results.csv")
    with atomic_path(csv) as tmp:
        df.to_csv(tmp, index=False)
    out.append(csv)
    return out


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns mixing types (e.g. numbers and names) become strings for Parquet."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            kinds = {
                type(v)
                for v in df[c]
                if v is not None and not (isinstance(v, float) and math.isnan(v))
            }
            if len(kinds) > 1:
                df[c] = df[c].map(lambda v: None if v is None else str(v))
    return df


# --------------------------------------------------------------------------- API


def sweep(
    spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec,
    *,
    out: str | os.PathLike[str] | None = None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    retry_failed: bool = False,
    on_row: Callable[[dict[str, Any], int, int], None] | None = None,
) -> pd.DataFrame:
    """Run every cell of ``spec`` and return the results table (one row per cell).

    ``executor``: ``local`` (process pool, default), ``serial`` (this process) or ``ray``
    (``address`` of a cluster, else a local Ray with ``workers`` CPUs). With ``out``, rows are
    journaled there and cells already journaled are not run again (``retry_failed`` re-runs
    the failed ones). ``on_row(row, done, total)`` is called after each finished cell.
    """
    s = SweepSpec.load(spec)
    if executor not in _EXECUTORS:
        raise InputError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise InputError(f"workers must be >= 1, got {workers}")
    cells = s.cells()
    ids = [cell_id(c) for c in cells]
    if len(set(ids)) != len(ids):
        raise InputError("the sweep has duplicate cells (repeated trace or grid values)")
    done: dict[str, dict[str, Any]] = {}
    journal = None
    if out is not None:
        out = os.fspath(out)
        journal_rows = read_journal(out)
        done = {
            i: r
            for i, r in journal_rows.items()
            if i in set(ids) and not (retry_failed and r.get("status") != "ok")
        }
        journal = _Journal(out)
    index = {i: n for n, i in enumerate(ids)}
    rows = [{**r, "cell": index[i]} for i, r in done.items()]
    todo = [c for c, i in zip(cells, ids) if i not in done]
    total, finished = len(cells), len(rows)
    base_dir = os.getcwd()
    run = _EXECUTORS[executor]
    try:
        if todo:
            for row in run(todo, base_dir, min(workers, len(todo)), address):
                row = {"cell": index[row["cell_id"]], **row}
                if journal is not None:
                    journal.append(row)
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
