"""Calibration on CPU tensors: the profile it writes is one the simulator accepts."""

from __future__ import annotations

import json

import pytest

from kvsim.cli import main
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.transfer_model import load_transfer_profile
from kvsim.engine.transfer_protocol import STORE, TransferJob
from real.calibrate import BOTH, D2H, H2D, KIB, Point, fit, measure, to_profile
from real.copy_path import TorchCopy
from real.device import Device
from real.host_pool import PinError


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


class _Registrar:
    def __init__(self) -> None:
        self.live: dict[int, int] = {}

    def register(self, ptr: int, nbytes: int) -> None:
        self.live[ptr] = nbytes

    def unregister(self, ptr: int) -> None:
        del self.live[ptr]

    def covers(self, t) -> bool:
        a, n = t.data_ptr(), t.numel() * t.element_size()
        return any(p <= a and a + n <= p + size for p, size in self.live.items())


class _SpyPath(TorchCopy):
    """The CPU copy path, recording every host tensor it was handed and the access order."""

    def __init__(self, reg: _Registrar) -> None:
        self.reg = reg
        self.calls: list[tuple[bool, bool, bool]] = []

    def copy(self, dst, src, runs, *, stream, stable_source):
        d_ok = all(self.reg.covers(dst[a : a + n]) for a, _, n in runs)
        s_ok = all(self.reg.covers(src[b : b + n]) for _, b, n in runs)
        self.calls.append((d_ok, s_ok, stable_source))
        super().copy(dst, src, runs, stream=stream, stable_source=stable_source)


def test_both_host_buffers_are_pinned_and_the_device_path_is_timed():
    """Fault 2: the D2H destination is page-locked like the pool (a pageable one would make
    the copy synchronous and staged); fault 3: calibration times the device's copy path."""
    reg = _Registrar()
    dev = Device("cpu", mode="threaded")
    spy = _SpyPath(reg)
    dev.set_copy_path(spy)
    points, pinned = measure(
        dev,
        sizes=(4 * KIB, 64 * KIB),
        counts=(1, 2),
        kernel_counts=(),  # the grid without the kernel fit's extra loads
        max_bytes=256 * KIB,
        repeats=1,
        pin=True,
        register=reg.register,
        unregister=reg.unregister,
    )
    assert pinned and len(points) == 12 and reg.live == {}  # all released afterwards
    assert len(spy.calls) == 4 * 8  # 4 points x (warm-up + 1 repeat) x (h2d + d2h + both x2)
    # every copy touches host memory on one side only, and that side is registered
    assert all(d_ok or s_ok for d_ok, s_ok, _ in spy.calls)
    loads = [c for c in spy.calls if c[1]]  # host source: H2D
    stores = [c for c in spy.calls if c[0]]  # host destination: D2H
    assert loads and stores and len(loads) + len(stores) == len(spy.calls)
    assert all(c[2] for c in loads) and not any(c[2] for c in stores)  # ANY only for loads


def test_calibrate_on_cuda_refuses_an_unpinned_host_buffer():
    """Fault 6: with pinning required (the CUDA default) a failed registration stops it."""

    def fail(ptr, n):
        raise RuntimeError("cudaHostRegister failed (injected)")

    with pytest.raises(PinError, match="injected"):
        measure(
            Device("cpu"),
            sizes=(4 * KIB,),
            counts=(1,),
            max_bytes=8 * KIB,
            pin=True,
            require_pin=True,
            register=fail,
            unregister=lambda p: None,
        )


def test_calibrate_refuses_buffers_the_machine_cannot_hold(tmp_path, capsys, monkeypatch):
    """Issue 27 item 9: the buffers are counted before any is allocated. On CPU the walk
    spans 4 x --max-mib and four buffers of it live in host memory (two host pools, two
    stand-in device buffers): --max-mib 1000000 would be 16 TB."""
    from real import calibrate as calibrate_mod
    from real import machine

    cpu = Device("cpu")
    assert calibrate_mod.calibration_bytes(cpu, 1 << 20) == (4 << 20, 0)
    out = tmp_path / "profile.json"
    for max_mib, free in (("1000000", None), ("16", 100 << 20)):
        if free is not None:  # 16 MiB: 256 MiB of buffers against 100 MiB free
            monkeypatch.setattr(machine, "available_memory", lambda free=free: free)
        with pytest.raises(SystemExit) as exc:
            main(["calibrate", "--out", str(out), "--device", "cpu", "--max-mib", max_mib])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2, err
        assert len(err.splitlines()) == 1 and "--max-mib" in err and "Traceback" not in err
        assert not out.exists()


def test_device_memory_is_checked_where_there_is_a_device():
    """On CUDA the device buffers are checked against what the driver reports free; off
    CUDA there is no device memory to check (the CPU stand-in is counted as host)."""
    import torch

    from kvsim.core.errors import InputError
    from real.machine import check_device_fits, device_memory_available

    assert device_memory_available(torch.device("cpu")) is None
    check_device_fits(1 << 50, torch.device("cpu"), "x", "hint")  # nothing to check
    with pytest.raises(InputError, match=r"needs 2\.00 GiB on cuda:0 but only 1\.00 GiB .*--max"):
        check_device_fits(2 << 30, torch.device("cuda", 0), "x", "use --max", available=1 << 30)
