"""The device check script runs on CPU with small sizes and prints its compact report."""

from __future__ import annotations

import json

from real import gpu_check


def test_gpu_check_small_on_cpu(tmp_path, capsys):
    rc = gpu_check.main(["--small", "--out", str(tmp_path)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "bandwidth GB/s by copy size" in text and "2 MiB" in text
    assert text.count("integrity [") == 2 and "0 mismatched" in text
    assert "validation:" in text and "hit_decisions_identical=True" in text
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    assert all(it["checked_blocks"] > 0 and it["mismatched_blocks"] == 0 for it in rep["integrity"])
    assert rep["pinned"] is False
    assert (tmp_path / "profile.json").exists()
