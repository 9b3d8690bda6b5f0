"""The one table writer (kvsim.report.tables): Result.save and a sweep's results write the
same two files the same way, and a column that mixes value types no longer breaks Parquet."""

from __future__ import annotations

import pandas as pd
import pytest

from kvsim.report.result import Result
from kvsim.report.tables import parquet_safe, write_table
from kvsim.sweeps import write_results


def _mixed() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "n": [1, 2, 3],
            "value": [1, "lru", None],
            "flag": [True, None, False],
            "name": list("abc"),
        }
    )


def test_a_mixed_column_is_text_in_parquet_and_as_written_in_csv(tmp_path):
    df = _mixed()
    assert write_table(df, tmp_path, "t") == ["t.parquet", "t.csv"]
    back = pd.read_parquet(tmp_path / "t.parquet")
    assert back["value"].tolist()[:2] == ["1", "lru"] and pd.isna(back["value"][2])
    assert back["flag"].tolist()[::2] == [True, False] and pd.isna(back["flag"][1])  # kept
    assert back["n"].tolist() == [1, 2, 3] and back["name"].tolist() == ["a", "b", "c"]
    assert (tmp_path / "t.csv").read_text().splitlines()[1:] == [
        "1,1,True,a",
        "2,lru,,b",
        "3,,False,c",
    ]
    assert df["value"].tolist() == [1, "lru", None]  # the caller's table is not changed


def test_result_save_writes_a_mixed_table_that_plain_pyarrow_refuses(tmp_path):
    import pyarrow as pa

    df = _mixed()
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        df.to_parquet(tmp_path / "plain.parquet", engine="pyarrow", index=False)
    written = Result(summary={"requests": 3}, tables={"requests": df}).save(tmp_path / "run")
    assert {"requests.parquet", "requests.csv"} <= set(written)
    back = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert back["value"].tolist()[:2] == ["1", "lru"] and pd.isna(back["value"][2])


def test_the_sweep_results_and_a_saved_run_are_the_same_files(tmp_path):
    df = _mixed()
    paths = write_results(df, tmp_path / "sweep")
    assert paths == [
        str(tmp_path / "sweep" / "results.parquet"),
        str(tmp_path / "sweep" / "results.csv"),
    ]
    Result(summary={}, tables={"results": df}).save(tmp_path / "run")
    for name in ("results.parquet", "results.csv"):
        assert (tmp_path / "sweep" / name).read_bytes() == (tmp_path / "run" / name).read_bytes()


def test_a_table_needing_nothing_is_not_copied():
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    assert parquet_safe(df) is df
