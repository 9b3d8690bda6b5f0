"""Per-request CSV rows by a forked helper process: the same bytes as formatting in
process, the file whole or absent when either side fails, and no helper left behind."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from kvsim.cachemode import row_writer
from kvsim.cachemode.row_writer import csv_rows
from kvsim.core.errors import InputError
from kvsim.core.io import atomic_path

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the helper needs fork")

LINE = "%s,%s,%s\r\n"
HEADER = "a,b,c\r\n"


class Label:
    """An id marshal cannot carry: its batch crosses as text."""

    def __str__(self) -> str:
        return "label"


def _rows(n: int, start: int = 0) -> list[tuple]:
    return [(i, i / 7, i % 3 == 0) for i in range(start, start + n)]


def _write(path: Path, batches: list[list[tuple]], helper: bool, monkeypatch) -> bytes:
    monkeypatch.setattr(row_writer, "can_fork", lambda: helper)
    with atomic_path(path) as tmp, csv_rows(tmp, HEADER, LINE) as write:
        for batch in batches:
            write(batch)
    return path.read_bytes()


def test_the_helper_writes_the_bytes_formatting_in_process_writes(tmp_path, monkeypatch):
    batches = [_rows(3000), [], _rows(5, 3000), [(Label(), 0.5, False)], _rows(1, 9)]
    here = _write(tmp_path / "here.csv", batches, False, monkeypatch)
    helper = _write(tmp_path / "helper.csv", batches, True, monkeypatch)
    assert helper == here
    assert here.startswith(HEADER.encode()) and b"\r\nlabel,0.5,False\r\n" in here
    assert here.count(b"\r\n") == 1 + 3000 + 5 + 1 + 1


def test_a_helper_that_fails_leaves_no_file_and_says_so(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(row_writer, "can_fork", lambda: True)
    out = tmp_path / "rows.csv"
    with (
        pytest.raises(InputError, match=r"rows\.csv: cannot write .*helper.*exit code 1"),
        atomic_path(out) as tmp,
        csv_rows(tmp, HEADER, "%s\r\n") as write,
    ):
        write(_rows(10))  # three values for one place: the helper's formatting fails
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert "not all arguments converted" in capfd.readouterr().err


def test_a_failing_replay_stops_the_helper_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(row_writer, "can_fork", lambda: True)
    out = tmp_path / "rows.csv"
    children: list[int] = []
    fork = os.fork

    def counted_fork() -> int:
        pid = fork()
        if pid:
            children.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counted_fork)
    with (
        pytest.raises(RuntimeError, match="mid-run"),
        atomic_path(out) as tmp,
        csv_rows(tmp, HEADER, LINE) as write,
    ):
        write(_rows(100))
        raise RuntimeError("mid-run")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    (pid,) = children
    with pytest.raises(ChildProcessError):  # already reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)


def test_the_helper_is_used_only_where_forking_is_safe(monkeypatch):
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert not row_writer.can_fork()
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "IPython", object())
    assert not row_writer.can_fork()
    monkeypatch.delitem(sys.modules, "IPython")
    assert row_writer.can_fork()


def test_a_replay_with_a_progress_bar_still_forks_its_helper(tmp_path, monkeypatch, capsys):
    """tqdm's monitor thread would make the process multi-threaded (so no fork): kvsim's
    bars start none, and the CSV helper is forked with the bar drawn."""
    from support import SAMPLE, run_main

    before = threading.active_count()
    seen: list[int] = []

    def can_fork() -> bool:
        seen.append(threading.active_count())
        return True

    monkeypatch.setattr(row_writer, "can_fork", can_fork)
    out = tmp_path / "r.csv"
    argv = ["replay", SAMPLE, "--cpu-chunks", "40", "--requests-csv", str(out), "--progress"]
    code, _, err = run_main(argv, capsys)
    assert code == 0, err
    assert "replaying: 100%" in err and seen == [before] and threading.active_count() == before
    assert out.read_bytes().count(b"\r\n") == 201
