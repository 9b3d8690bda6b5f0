"""A table on disk: the one writer behind ``Result.save`` (``simulate --out``) and a sweep's
``results`` files, so both write the same two files the same way.

Each table becomes ``NAME.parquet`` (for pandas / pyarrow / DuckDB) and ``NAME.csv`` (for
anything else), each written whole or not at all (:mod:`kvsim.core.io`). Parquet stores one
type per column, so an object column that mixes types (a sweep's ``vllm_config`` axis holding
paths and mappings, a summary column holding numbers and names) is written as text there;
the CSV, which is text anyway, keeps the values as they are.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvsim.core.io import atomic_path, atomic_write

if TYPE_CHECKING:  # pandas loads with the first table (start-up: see kvsim.cli)
    import pandas as pd

__all__ = ["parquet_safe", "write_table"]


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
    with atomic_path(os.path.join(out, f"{name}.parquet")) as tmp:
        parquet_safe(df).to_parquet(tmp, engine="pyarrow", index=False)
    if not csv:
        return [f"{name}.parquet"]
    with atomic_write(os.path.join(out, f"{name}.csv"), newline="") as f:
        df.to_csv(f, index=False)
    return [f"{name}.parquet", f"{name}.csv"]


def parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every object column that mixes value types (None and NaN aside) turned
    into text, which Parquet can store; ``df`` itself when no column needs it."""
    mixed = [c for c in df.columns if df[c].dtype == object and _kinds(df[c]) > 1]
    if not mixed:
        return df
    df = df.copy()
    for c in mixed:
        df[c] = df[c].map(lambda v: None if v is None else str(v))
    return df


def _kinds(column: pd.Series) -> int:
    """How many Python types the column's values have, missing values not counted."""
    return len({type(v) for v in column.dropna()})
