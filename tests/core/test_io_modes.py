"""kvsim/core/io.py atomic_path: the file it writes has the mode a plain open() would give
it (a new file the umask's, an existing file its own), and any name a plain open() takes."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvsim.core.io import atomic_path


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def _write(path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("new")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.usefixtures("umask_027")
def test_a_new_file_gets_the_umask_mode(tmp_path: Path) -> None:
    target = tmp_path / "new.csv"
    _write(target)
    assert _mode(target) == 0o640


@pytest.mark.usefixtures("umask_027")
@pytest.mark.parametrize("mode", [0o600, 0o644, 0o755])
def test_an_existing_file_keeps_its_mode(tmp_path: Path, mode: int) -> None:
    # it was set to the umask's (0640 here): a file made private with chmod 600 was made
    # group-readable by writing it again
    target = tmp_path / "old.csv"
    target.write_text("old", encoding="utf-8")
    os.chmod(target, mode)
    _write(target)
    assert target.read_text(encoding="utf-8") == "new"
    assert _mode(target) == mode


@pytest.mark.usefixtures("umask_027")
def test_a_symlinked_file_keeps_the_mode_of_the_file_it_points_to(tmp_path: Path) -> None:
    real = tmp_path / "real.csv"
    real.write_text("old", encoding="utf-8")
    os.chmod(real, 0o600)
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    _write(link)
    assert link.is_symlink()
    assert _mode(real) == 0o600


@pytest.mark.parametrize("stem", ["x" * 250, "é" * 125])
def test_a_name_near_the_length_limit_is_written(tmp_path: Path, stem: str) -> None:
    # 254 bytes, which a plain open() takes: its temporary name, 14 bytes longer, was not
    target = tmp_path / f"{stem}.csv"[-254:]
    _write(target)
    assert target.read_text(encoding="utf-8") == "new"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux's /proc only")
@pytest.mark.usefixtures("umask_027")
def test_the_umask_is_read_without_being_set(tmp_path: Path, monkeypatch) -> None:
    """Setting the umask to read it is process-wide: a file another thread made in that
    moment got mode 0666. Where /proc gives it, it is only read."""
    calls: list[int] = []
    real_umask = os.umask
    monkeypatch.setattr(os, "umask", lambda m: calls.append(m) or real_umask(m))
    target = tmp_path / "new.csv"
    _write(target)
    assert _mode(target) == 0o640 and calls == []
