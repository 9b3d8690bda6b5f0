"""A table on disk: the one writer behind ``Result.save`` (``simulate --out``) and a sweep's
``results`` files, so both write the same two files the same way.

Each table becomes ``NAME.parquet`` (for pandas / pyarrow / DuckDB) and ``NAME.csv`` (for
anything else), each written whole or not at all (:mod:`kvsim.core.io`). Parquet stores one
type per column, so an object column that mixes types (a sweep's ``vllm_config`` axis holding
paths and mappings, a summary column holding numbers and names) is written as text there;
the CSV, which is text anyway, has the same text.

The CSV is written by Arrow's C++ writer, as cache mode's ``--requests-csv`` rows are
(:mod:`kvsim.cachemode.row_writer`): a fleet's steps table has millions of rows, which
pandas' ``to_csv`` formats in Python at about 20 us a row (9x Arrow's time, docs/speed.md).
Numbers are the shortest text that reads back as the same value (``0`` for 0.0), booleans
``true`` / ``false``, a missing value an empty field; text is quoted only when a value of
its table needs quotes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvsim.core.io import atomic_path

if TYPE_CHECKING:  # pandas loads with the first table (start-up: see kvsim.cli)
    import pandas as pd
    import pyarrow as pa

__all__ = ["parquet_safe", "write_table"]

_ROW_GROUP = 16384  # rows per Parquet row group (docs/speed.md, "Columns that grow in place")


def write_table(
    df: pd.DataFrame, folder: str | os.PathLike[str], name: str, csv: bool = True
) -> list[str]:
    """Write ``df`` as ``folder/NAME.parquet`` and ``folder/NAME.csv`` (no index column).

    Args:
        df: the table; not changed.
        folder: where the files go (created when missing).
        name: the files' name without suffix (``requests``, ``results``).
        csv: also the CSV (a sweep's per-cell requests tables are Parquet only: many, large).

    Returns:
        the file names written, ``[NAME.parquet, NAME.csv]`` (relative to ``folder``).
    """
    out = os.fspath(folder)
    safe = parquet_safe(df)
    with atomic_path(os.path.join(out, f"{name}.parquet")) as tmp:
        # row groups of 16,384 rows: the writer buffers a whole group, so one group of a
        # steps table (a row a step) took 1.6x the table again at the run's peak
        safe.to_parquet(tmp, engine="pyarrow", index=False, row_group_size=_ROW_GROUP)
    if not csv:
        return [f"{name}.parquet"]
    with atomic_path(os.path.join(out, f"{name}.csv")) as tmp:
        _write_csv(safe, tmp)
    return [f"{name}.parquet", f"{name}.csv"]


def _write_csv(safe: pd.DataFrame, path: str) -> None:
    """``safe`` (a :func:`parquet_safe` table) as CSV at ``path`` (overwritten; no index
    column) by Arrow's writer: header and values unquoted unless some column name or text
    value holds a comma, quote or line break, then every name and text value is quoted
    (Arrow quotes all or none). A column Arrow cannot write (lists, mappings) is written as
    its values' text."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    table = _arrow_table(safe)
    try:
        plain = pa_csv.WriteOptions(quoting_style="none", quoting_header="none")
        pa_csv.write_csv(table, path, plain)
    except pa.ArrowInvalid:  # a name or text value needs quotes
        pa_csv.write_csv(table, path, pa_csv.WriteOptions(quoting_style="needed"))


def _arrow_table(safe: pd.DataFrame) -> pa.Table:
    """``safe`` (a :func:`parquet_safe` table) as an Arrow table of types the CSV writer
    takes."""
    import pyarrow as pa

    try:
        table = pa.Table.from_pandas(safe, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        table = None
    if table is not None and all(_writable(t) for t in table.schema.types):
        return table
    text = safe.copy()
    for c in text.columns:
        if text[c].dtype == object:
            text[c] = _as_text(text[c])
    return pa.Table.from_pandas(text, preserve_index=False)


def _writable(kind: pa.DataType) -> bool:
    """Whether Arrow's CSV writer writes values of ``kind`` (not lists, structs, maps)."""
    import pyarrow as pa

    return not (pa.types.is_nested(kind) or pa.types.is_dictionary(kind))


def parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every object column that mixes value types (None and NaN aside), or holds
    an int past 64 bits (a CPU tier of 1e15 chunks has its bytes past int64), turned into
    text, which Parquet can store; ``df`` itself when no column needs it."""
    mixed = [
        c for c in df.columns if df[c].dtype == object and (_kinds(df[c]) > 1 or _past_int64(df[c]))
    ]
    if not mixed:
        return df
    df = df.copy()
    for c in mixed:
        df[c] = _as_text(df[c])
    return df


def _as_text(column: pd.Series) -> pd.Series:
    """Each value of ``column`` as its text; None stays missing."""
    return column.map(lambda v: None if v is None else str(v))


def _past_int64(column: pd.Series) -> bool:
    """Whether an int of ``column`` does not fit in 64 bits (Arrow's widest integer)."""
    return any(isinstance(v, int) and not -(1 << 63) <= v < (1 << 63) for v in column.dropna())


def _kinds(column: pd.Series) -> int:
    """How many Python types the column's values have, missing values not counted."""
    return len({type(v) for v in column.dropna()})
