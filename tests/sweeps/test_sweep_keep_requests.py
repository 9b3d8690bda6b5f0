"""Issue 28 item 3, last part: ``kvsim sweep --keep-requests`` keeps each cell's requests
table (``OUT/cells/CELL_ID/requests.parquet``), the rows of that cell run alone, and a resumed
cell whose table is missing runs again."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from support import SAMPLE, expect_overload, run_main

import kvsim
from kvsim.core.errors import InputError
from kvsim.sweeps import CELLS, read_requests, table_path

pytestmark = expect_overload

#: a two-cell timed sweep, small enough to run in seconds
TIMED = [
    "sweep",
    "--trace",
    SAMPLE,
    "--mode",
    "timed",
    "--limit",
    "12",
    "--cpu-chunks",
    "4,400",
    "--executor",
    "serial",
    "--no-progress",
]


def _results(out) -> pd.DataFrame:
    return pd.read_parquet(out / "results.parquet")


def test_each_timed_cell_keeps_the_table_simulate_writes_for_it(tmp_path, capsys):
    out = tmp_path / "sweep"
    code, _, err = run_main([*TIMED, "--keep-requests", "--out", out], capsys)
    assert code == 0, err
    results = _results(out)
    assert len(results) == 2
    assert sorted(p.name for p in (out / CELLS).iterdir()) == sorted(results["cell_id"])
    for row in results.itertuples():
        alone = tmp_path / f"alone-{row.cpu_chunks}"
        args = ["simulate", SAMPLE, "--limit", 12, "--cpu-chunks", row.cpu_chunks]
        code, _, err = run_main([*args, "--no-progress", "--out", alone], capsys)
        assert code == 0, err
        kept = pd.read_parquet(table_path(out, row.cell_id))
        pd.testing.assert_frame_equal(kept, pd.read_parquet(alone / "requests.parquet"))
    assert not list(out.rglob("*.tmp"))  # written whole: no temporary file left


def test_a_cache_cell_keeps_what_replay_requests_csv_writes(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--trace", SAMPLE, "--limit", 30, "--policy", "lru,arc", "--cpu-chunks", 64]
    code, _, err = run_main(
        [*args, "--executor", "serial", "--keep-requests", "--out", out], capsys
    )
    assert code == 0, err
    for row in _results(out).itertuples():
        csv = tmp_path / f"{row.policy}.csv"
        replay = ["replay", SAMPLE, "--limit", 30, "--policy", row.policy, "--cpu-chunks", 64]
        code, _, err = run_main([*replay, "--requests-csv", csv, "--no-progress"], capsys)
        assert code == 0, err
        kept = pd.read_parquet(table_path(out, row.cell_id))
        assert len(kept) == 30
        pd.testing.assert_frame_equal(kept, pd.read_csv(csv), check_dtype=False)


def test_resume_runs_again_only_the_cells_whose_table_is_missing(tmp_path, capsys):
    out = tmp_path / "sweep"
    code, _, err = run_main([*TIMED, "--out", out], capsys)  # without the option first
    assert code == 0 and not (out / CELLS).exists()
    code, said, err = run_main([*TIMED, "--keep-requests", "--out", out], capsys)
    assert code == 0, err
    assert "from the journal" not in said  # no table yet: both cells ran again
    results = _results(out)
    first, second = (table_path(out, c) for c in results["cell_id"])
    kept = pd.read_parquet(second)
    os.unlink(first)  # as a sweep killed after the table's cell, before its journal line
    code, said, err = run_main([*TIMED, "--keep-requests", "--out", out], capsys)
    assert code == 0, err
    assert "2 cells (2 ok, 0 failed; 1 run)" in said and "1 of them from the journal" in said
    assert os.path.exists(first)
    pd.testing.assert_frame_equal(pd.read_parquet(second), kept)  # not run again
    lines = (out / "journal.jsonl").read_text().splitlines()
    assert sorted({json.loads(x)["cell_id"] for x in lines}) == sorted(results["cell_id"])
    # run again without the option: the tables no longer match a row, so they go
    code, _, err = run_main([*TIMED, "--fresh", "--out", out], capsys)
    assert code == 0, err
    assert not os.path.exists(first) and not os.path.exists(second)


def test_the_api_reads_every_cells_table_as_one_with_its_cell(tmp_path):
    spec = {
        "mode": "timed",
        "traces": [SAMPLE],
        "limit": 12,
        "keep_requests": True,
        "grid": {"cpu_chunks": [4, 400]},
    }
    df = kvsim.sweep(spec, out=tmp_path, workers=2)  # the process pool's workers write them
    requests = read_requests(tmp_path)
    assert len(requests) == 24
    assert set(requests["cell_id"]) == set(df["cell_id"])
    by_cell = requests.groupby("cell_id")["cpu_chunks"].unique()
    assert {int(v[0]) for v in by_cell} == {4, 400}  # the varying column, per cell
    assert "policy" not in requests.columns  # the same in every cell: not repeated


def test_keep_requests_needs_a_folder_and_says_how_to_get_tables(tmp_path):
    spec = {"mode": "timed", "traces": [SAMPLE], "limit": 5, "keep_requests": True}
    with pytest.raises(InputError, match="keep_requests needs an output folder"):
        kvsim.sweep(spec)
    kvsim.sweep({**spec, "keep_requests": False}, out=tmp_path, executor="serial")
    with pytest.raises(InputError, match="rerun the sweep with --keep-requests"):
        read_requests(tmp_path)


def test_the_spec_key_is_checked_with_the_rest_of_the_spec():
    from kvsim.sweeps import SweepSpec

    spec = {"traces": [SAMPLE], "options": {"cpu_chunks": 8}}
    assert SweepSpec.from_mapping({**spec, "keep_requests": True}).keep_requests
    assert not SweepSpec.from_mapping(spec).keep_requests
    with pytest.raises(InputError, match="keep_requests"):
        SweepSpec.from_mapping({**spec, "keep_requests": "sometimes"})
    with pytest.raises(InputError, match="keep_requs"):  # a typo is named, not ignored
        SweepSpec.from_mapping({**spec, "keep_requs": True})
