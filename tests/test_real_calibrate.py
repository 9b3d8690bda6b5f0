"""Calibration on CPU tensors: the profile it writes is one the simulator accepts."""

from __future__ import annotations

import json

import pytest

from kvsim.cli import main
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.transfer_model import load_transfer_profile
from kvsim.engine.transfer_protocol import STORE, TransferJob
from real.calibrate import BOTH, D2H, H2D, KIB, Point, fit, to_profile
from real.device import Device


def test_fit_recovers_a_known_link():
    """Synthetic points from t = 10us + n * size / rate(size) give back the curve."""
    rate = {4 * KIB: 4e9, 64 * KIB: 40e9, 1 << 20: 50e9}
    pts = [
        Point(d, s, n, 10e-6 + n * s * (2 if d == BOTH else 1) / (r * (1.6 if d == BOTH else 1)))
        for d in (H2D, D2H, BOTH)
        for s, r in rate.items()
        for n in (1, 8, 64)
    ]
    fitted = fit(pts)
    for d in (H2D, D2H):
        got = fitted["directions"][d]
        assert got["overhead_s"] == pytest.approx(10e-6, rel=1e-6)
        assert got["effective_gbps"][str(64 * KIB)] == pytest.approx(40.0, rel=1e-6)
        assert 0 < got["per_copy_s"] < 4 * KIB / 4e9  # launch cost seen at small sizes
    assert fitted["duplex_factor"] == pytest.approx(0.8, rel=1e-6)
    params = to_profile(fitted, "synthetic")
    for s, r in rate.items():  # the model reproduces every calibrated point
        for n in (1, 8, 64):
            assert params.h2d.job_time(n * s, n) == pytest.approx(10e-6 + n * s / r, rel=1e-9)


def test_calibrate_command_writes_a_profile_the_simulator_loads(tmp_path, capsys):
    out, rep = tmp_path / "profile.json", tmp_path / "points.json"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "calibrate",
                "--out",
                str(out),
                "--device",
                "cpu",
                "--max-mib",
                "1",
                "--repeats",
                "1",
                "--report",
                str(rep),
            ]
        )
    assert exc.value.code == 0
    assert "h2d peak GB/s" in capsys.readouterr().out
    params = load_transfer_profile(out)
    assert params.link == "cpu-emulated"
    sizes = [s for s, _ in params.h2d.curve]
    assert sizes[0] == 4096 and sizes == sorted(sizes) and len(sizes) >= 8
    assert json.loads(rep.read_text())["pinned"] is False
    backend = SimulatedTransferBackend(params)
    backend.submit(TransferJob(1, STORE, [0], [0], 1 << 20, 4), 0.0)
    t, [res] = backend.wait([1], 0.0)
    assert res.success and t == pytest.approx(params.d2h.job_time(1 << 20, 4))


def test_calibrate_rejects_cuda_without_cuda(capsys):
    if Device.auto().is_cuda:
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--out", "/tmp/never.json", "--device", "cuda"])
    assert exc.value.code == 2 and "cuda" in capsys.readouterr().err
