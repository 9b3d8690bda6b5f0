"""Packages carried to the GPU machine in ``.gpu_deps/`` are found, and a missing one is named."""

from __future__ import annotations

import os
import subprocess
import sys

from real.carried_deps import child_pythonpath, missing_modules, use_carried_deps


def test_a_carried_folder_goes_first_on_the_path_once(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "kvsim_carried_probe").mkdir()
    (tmp_path / "kvsim_carried_probe" / "__init__.py").write_text("")
    assert missing_modules(("kvsim_carried_probe",)) == ["kvsim_carried_probe"]
    assert use_carried_deps(tmp_path) is True
    assert sys.path[0] == str(tmp_path)
    assert use_carried_deps(tmp_path) is False  # idempotent
    assert missing_modules(("kvsim_carried_probe", "msgspec")) == []


def test_no_folder_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = list(sys.path)
    assert use_carried_deps(tmp_path / "absent") is False
    assert sys.path == before


def test_a_child_python_finds_the_carried_folder(tmp_path):
    """The check's own ``pytest tests/real`` runs in a child, which does not inherit
    ``sys.path``: its ``PYTHONPATH`` names the carried folder when there is one."""
    (tmp_path / "kvsim_carried_probe").mkdir()
    (tmp_path / "kvsim_carried_probe" / "__init__.py").write_text("")
    probe = [sys.executable, "-c", "import kvsim_carried_probe"]
    for folder, found in ((tmp_path, True), (tmp_path / "absent", False)):
        path = child_pythonpath("/checkout", folder)
        assert path.split(os.pathsep)[0] == "/checkout"
        env = {**os.environ, "PYTHONPATH": path}
        assert (subprocess.run(probe, env=env, capture_output=True).returncode == 0) is found
