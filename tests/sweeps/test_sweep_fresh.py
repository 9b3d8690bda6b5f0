"""Issue 28 item 6: a re-run sweep says how many cells came from its journal, and --fresh
runs them all again."""

from __future__ import annotations

from support import SAMPLE, run_main


def test_resumed_cells_are_counted_and_fresh_runs_them_again(tmp_path, capsys):
    out = tmp_path / "o"
    args = [
        "sweep",
        "--trace",
        SAMPLE,
        "--policy",
        "lru,arc",
        "--cpu-chunks",
        "256",
        "--out",
        str(out),
        "--executor",
        "serial",
        "--no-progress",
    ]
    code, first, _ = run_main(args, capsys)
    assert code == 0 and "from the journal" not in first and "2 cells (2 ok, 0 failed)" in first
    code, again, _ = run_main(args, capsys)
    assert code == 0
    assert "2 cells (2 ok, 0 failed; 0 run)" in again
    assert f"2 of them from the journal in {out}" in again and "--fresh" in again
    code, fresh, _ = run_main([*args, "--fresh"], capsys)
    assert code == 0 and "from the journal" not in fresh
    assert len((out / "journal.jsonl").read_text().splitlines()) == 2  # a new journal
