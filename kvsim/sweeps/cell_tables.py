"""Each cell's requests table, kept in a sweep's output folder (``keep_requests: true``,
``kvsim sweep --keep-requests``) so that per-request figures (``kvsim plot DIR --kind
ttft-cdf``) and notebooks can read them.

The table of the cell with id ``ID`` (the results table's ``cell_id`` column) is
``DIR/cells/ID/requests.parquet``: the rows ``kvsim simulate`` (timed cells) or ``kvsim
replay --requests-csv`` (cache cells) writes for that cell alone. The cell's worker writes
it whole or not at all (a temporary file renamed), before its row reaches the journal, so a
journaled row whose table is missing (the sweep killed in between, or run without the
option) is run again by a sweep with the option; the driver removes the table of a cell
re-run without it or failed, so a table never outlives its row.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from kvsim.core.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

#: the folder of per-cell tables in a sweep's output folder
CELLS = "cells"
#: a cell's requests table (Parquet only: a sweep has many, each as long as its trace)
REQUESTS = "requests"
#: the column naming a request's cell in :func:`read_requests`' table
CELL_ID = "cell_id"
#: what to do when a sweep was run without the option
RERUN = "rerun the sweep with --keep-requests (keep_requests: true) into the same folder"


def table_path(folder: str | os.PathLike[str], cid: str) -> str:
    """Where the requests table of cell ``cid`` lives in the sweep folder ``folder``."""
    return os.path.join(os.fspath(folder), CELLS, cid, f"{REQUESTS}.parquet")


def write_requests(folder: str, cid: str, requests: pd.DataFrame) -> None:
    """Write cell ``cid``'s requests table atomically (see the module doc)."""
    from kvsim.report.tables import write_table

    write_table(requests, os.path.dirname(table_path(folder, cid)), REQUESTS, csv=False)


def has_requests(folder: str, cid: str) -> bool:
    """Whether cell ``cid``'s table is there (a resumed cell without it runs again)."""
    return os.path.isfile(table_path(folder, cid))


def drop_requests(folder: str, cid: str) -> None:
    """Remove cell ``cid``'s table, if any: its cell ran again without keeping one."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(table_path(folder, cid))


def read_requests(
    folder: str | os.PathLike[str], results: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Every successful cell's requests table of the sweep in ``folder``, as one table: the
    requests' columns, then :data:`CELL_ID`, then the cell's configuration columns that
    vary across the sweep (``policy``, ``cpu_gib``, ...), in results order.

    Args:
        folder: a ``kvsim sweep --out`` folder.
        results: its results table (default: read from ``folder``).

    Returns:
        one row per request of every ``ok`` cell.

    Raises:
        InputError: no results table, or a successful cell without its table (the sweep
            was run without ``keep_requests``: the message says to rerun with it).
    """
    import pandas as pd

    where = os.fspath(folder)
    if results is None:
        results = read_results(where)
    ok = results[results["status"] == "ok"] if "status" in results.columns else results
    if ok.empty:
        raise InputError("the sweep has no successful cell", source=where)
    missing = [str(c) for c in ok[CELL_ID] if not has_requests(where, str(c))]
    if missing:
        some = "none" if len(missing) == len(ok) else f"{len(missing)} of {len(ok)}"
        raise InputError(
            f"{some} of the sweep's successful cells kept a requests table; {RERUN}",
            source=where,
        )
    varying = varying_columns(ok)
    frames = []
    for _, row in ok.iterrows():
        table = pd.read_parquet(table_path(where, str(row[CELL_ID])))
        config = {c: row[c] for c in [CELL_ID, *varying] if c not in table.columns}
        frames.append(table.assign(**config))
    return pd.concat(frames, ignore_index=True)


def check_timed(results: pd.DataFrame, source: str | None = None) -> None:
    """Refuse a TTFT figure of a cache-mode sweep: its requests have hits, no times."""
    if "mode" in results.columns and not (results["mode"] == "timed").any():
        raise InputError(
            "ttft-cdf needs a timed sweep (mode: timed, kvsim sweep --mode timed); a cache-mode "
            "sweep's requests tables have hits per request, no times",
            source=source,
        )


def read_results(folder: str) -> pd.DataFrame:
    """A sweep folder's results table (Parquet, else CSV)."""
    import pandas as pd

    for name, read in (("results.parquet", pd.read_parquet), ("results.csv", pd.read_csv)):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            try:
                return read(path)
            except (OSError, ValueError) as e:
                raise InputError(f"cannot read table: {e}", source=path) from None
    raise InputError("not a sweep folder (no results.parquet or results.csv)", source=folder)


def varying_columns(results: pd.DataFrame, candidates: list[str] | None = None) -> list[str]:
    """The configuration columns that tell the cells apart: of ``candidates`` (default:
    every run parameter of the table) taken policy first, then the admission rule, then in
    the given order, those that vary, each kept only when it splits the cells further (a cell's
    ``cpu_gib`` follows from its ``cpu_chunks``: one of them is enough)."""
    import pandas as pd

    if candidates is None:
        from kvsim.sweeps.spec_schema import CELL_KEYS, option_names

        params = option_names("cache") | option_names("timed") | set(CELL_KEYS)
        candidates = [str(c) for c in results.columns if c in params]
    candidates = sorted(candidates, key=_priority)  # stable: given order within a priority
    chosen: list[str] = []
    keys = pd.Series("", index=results.index)
    for c in candidates:
        refined = keys + "\x1f" + results[c].astype(str)
        if refined.nunique() > keys.nunique():
            chosen.append(c)
            keys = refined
    return chosen


#: the columns a cell is named by first: the policy, then the admission rule
FIRST_COLUMNS = ("policy", "admission", "store_threshold")


def _priority(column: str) -> int:
    return FIRST_COLUMNS.index(column) if column in FIRST_COLUMNS else len(FIRST_COLUMNS)
