"""The one table writer (kvsim.report.tables): Result.save and a sweep's results write the
same two files the same way, and a column that mixes value types no longer breaks Parquet."""

from __future__ import annotations

import numpy as np
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
    assert (tmp_path / "t.csv").read_text().splitlines() == [
        "n,value,flag,name",  # nothing needs quotes, the names neither
        "1,1,true,a",
        "2,lru,,b",
        "3,,false,c",
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


def test_the_csv_reads_back_as_the_same_values(tmp_path):
    """Arrow's writer: shortest round-trip numbers (every float bit kept), empty missing
    values; a value holding a comma or a quote makes the text quoted; a column of lists is
    its values' text."""
    rng = np.random.default_rng(7)
    df = pd.DataFrame(
        {
            "step": np.arange(500, dtype=np.int64),
            "t": rng.random(500) * 1e4,
            "tiny": rng.random(500) * 1e-9,
            "gap": np.where(np.arange(500) % 7 == 0, np.nan, rng.random(500)),
            "whole": np.zeros(500),
        }
    )
    write_table(df, tmp_path, "steps")
    back = pd.read_csv(tmp_path / "steps.csv")
    pd.testing.assert_frame_equal(back, df, check_dtype=False, check_exact=True)
    assert (tmp_path / "steps.csv").read_text().splitlines()[1].startswith("0,")

    text = pd.DataFrame({"name": ["a,b", 'say "x"', "c"], "keys": [[1, 2], [3], []]})
    write_table(text, tmp_path, "text")
    assert (tmp_path / "text.csv").read_text().splitlines() == [
        '"name","keys"',
        '"a,b","[1, 2]"',
        '"say ""x""","[3]"',
        '"c","[]"',
    ]
    back = pd.read_csv(tmp_path / "text.csv")
    assert back["name"].tolist() == text["name"].tolist()

    named = pd.DataFrame({"a,b": [1, 2], "c": [0.5, 1.0]})  # a name that needs quotes
    write_table(named, tmp_path, "named")
    assert (tmp_path / "named.csv").read_text().splitlines() == ['"a,b","c"', "1,0.5", "2,1"]
    assert pd.read_csv(tmp_path / "named.csv").columns.tolist() == ["a,b", "c"]


def test_a_table_needing_nothing_is_not_copied():
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    assert parquet_safe(df) is df


def test_a_long_table_is_written_in_row_groups_and_reads_back_whole(tmp_path):
    """Parquet in row groups of 16,384 rows (the writer buffers a whole group: one group of
    a long steps table cost 1.6x the table at a run's peak), the values all read back."""
    import pyarrow.parquet as pq

    df = pd.DataFrame({"step": np.arange(40_000), "end_s": np.arange(40_000) * 0.5})
    write_table(df, tmp_path, "steps", csv=False)
    meta = pq.read_metadata(tmp_path / "steps.parquet")
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [
        16_384,
        16_384,
        7_232,
    ]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "steps.parquet"), df)


def test_an_int_past_64_bits_is_written_as_its_text(tmp_path):
    """A CPU tier of 1e15 chunks of 64 MiB holds 6.7e22 bytes: Arrow refused the column
    (an OverflowError as the sweep's results were written, after every cell ran)."""
    huge = 1_000_000_000_000_000 * (64 << 20)
    df = pd.DataFrame({"cpu_chunks": [10**15, 5], "cpu_bytes": [huge, 5 * (64 << 20)]})
    assert df["cpu_bytes"].dtype == object  # past int64: pandas keeps Python ints
    write_table(df, tmp_path, "results")
    back = pd.read_parquet(tmp_path / "results.parquet")
    assert back["cpu_bytes"].tolist() == [str(huge), str(5 * (64 << 20))]
    assert back["cpu_chunks"].tolist() == [10**15, 5]  # an int64 column stays one
    assert (tmp_path / "results.csv").read_text().splitlines()[1] == f"1000000000000000,{huge}"
