"""Every notebook in notebooks/ runs top to bottom on a small input (KVSIM_NB_LIMIT)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LIMIT = "100"
OURS = {"01_trace_anatomy.ipynb", "02_policy_capacity_study.ipynb"}


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= OURS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("KVSIM_NB_LIMIT", LIMIT)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [
        o
        for c in book.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    text = "".join(
        o.get("text", "")
        for c in book.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )
    if path.name in OURS:  # ours print the limit they ran with: the small input was used
        assert f"requests: {LIMIT}" in text
