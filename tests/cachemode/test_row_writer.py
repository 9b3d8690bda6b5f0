"""Per-request CSV rows by Arrow's CSV writer: the rows read back as written, the header
alone for no rows, and the file whole or absent when the replay or a value fails."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pytest

from kvsim.cachemode.row_writer import csv_rows
from kvsim.core.io import atomic_path

COLUMNS = [("a", "int64"), ("b", "double"), ("c", "bool")]


def _rows(n: int, start: int = 0) -> list[tuple]:
    return [(i, i / 7, i % 3 == 0) for i in range(start, start + n)]


def _write(path: Path, batches: list[list[tuple]]) -> list[list[str]]:
    with atomic_path(path) as tmp, csv_rows(tmp, COLUMNS) as write:
        for batch in batches:
            write(batch)
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_rows_read_back_as_written_in_order(tmp_path):
    batches = [_rows(3000), [], _rows(5, 3000), [(7, 0, False)], _rows(1, 9)]
    lines = _write(tmp_path / "rows.csv", batches)
    assert lines[0] == ["a", "b", "c"]
    back = [(int(a), float(b), c == "true") for a, b, c in lines[1:]]
    assert back == [r for batch in batches for r in batch]
    text = (tmp_path / "rows.csv").read_bytes()
    assert text.startswith(b"a,b,c\n0,0,true\n1,0.14285714285714285,false\n")
    assert text.count(b"\n") == 1 + 3000 + 5 + 1 + 1 and b"\r" not in text


def test_gzipped_rows_read_back_as_the_plain_file(tmp_path):
    """``gzip``: the same bytes, gzipped (the temporary name does not end in .gz)."""
    batches = [_rows(2500), _rows(3, 2500)]
    _write(tmp_path / "rows.csv", batches)
    with atomic_path(tmp_path / "rows.csv.gz") as tmp, csv_rows(tmp, COLUMNS, gzip=True) as w:
        assert not tmp.endswith(".gz")
        for batch in batches:
            w(batch)
    packed = (tmp_path / "rows.csv.gz").read_bytes()
    assert packed[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed) == (tmp_path / "rows.csv").read_bytes()


def test_no_rows_is_the_header_alone(tmp_path):
    assert _write(tmp_path / "rows.csv", []) == [["a", "b", "c"]]


@pytest.mark.parametrize("bad", [RuntimeError("mid-run"), "a value of the wrong type"])
def test_a_failure_leaves_no_file(tmp_path, bad):
    out = tmp_path / "rows.csv"
    with pytest.raises(Exception) as caught, atomic_path(out) as tmp, csv_rows(tmp, COLUMNS) as w:
        w(_rows(100))
        if isinstance(bad, Exception):
            raise bad
        w([("seven", 0.5, True)])
    assert not isinstance(caught.value, AssertionError)
    assert not out.exists() and list(tmp_path.iterdir()) == []
