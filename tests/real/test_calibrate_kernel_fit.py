"""Calibration fits vLLM's gather kernel for small-page loads (kvsim issue 12 follow-up).

Loads timed through the kernel (``triton-gather`` points) give the profile an H2D
``kernel`` entry, fitted like the DMA curve (per size, a line in the copy count); a device
without the kernel (every CPU run) gives none, and the simulator then models every load as
DMA, as the real backend ran it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvsim.cli import main
from kvsim.engine.copy_paths import load_uses_kernel
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.transfer_model import DMA, KERNEL, load_transfer_profile
from kvsim.engine.transfer_protocol import LOAD, TransferJob
from real.calibrate import (
    BOTH,
    D2H,
    DEFAULT_COUNTS,
    DEFAULT_SIZES,
    H2D,
    KERNEL_COUNTS,
    KIB,
    Point,
    fit,
    fit_count_lines,
    kernel_eligible_counts,
)
from real.profile import to_profile
from real.triton_load import GatherKernel

OVERHEAD = 10e-6  # every transfer's fixed cost (the DMA fit's overhead_s)
PER_COPY = 0.3e-6  # DMA host cost per copy
LAUNCH = 30e-6  # the kernel's extra fixed cost
DMA_GBPS = {4 * KIB: 4.0, 8 * KIB: 6.0, 16 * KIB: 8.0, 64 * KIB: 40.0, 1 << 20: 50.0}
KERNEL_GBPS = {4 * KIB: 20.0, 8 * KIB: 28.0, 16 * KIB: 35.0}


def kernel_seconds(size: int, n: int) -> float:
    return OVERHEAD + LAUNCH + n * size / (KERNEL_GBPS[size] * 1e9)


def synthetic_points(noise: float = 0.0, seed: int = 0) -> list[Point]:
    """The default grid on a link with known DMA and kernel costs; loads of >= 16 small
    pages are timed through the kernel, as on a CUDA device where it resolved."""
    rng = np.random.default_rng(seed)
    pts = []
    for size, gbps in DMA_GBPS.items():
        for n in sorted({*DEFAULT_COUNTS, *kernel_eligible_counts(size, KERNEL_COUNTS)}):
            for d in (H2D, D2H, BOTH):
                if n not in DEFAULT_COUNTS and d != H2D:
                    continue
                if d != D2H and load_uses_kernel(size, n):
                    secs, path = kernel_seconds(size, n), GatherKernel.name
                else:
                    secs, path = OVERHEAD + n * (PER_COPY + size / (gbps * 1e9)), "copy_"
                pts.append(Point(d, size, n, secs * (1 + noise * rng.standard_normal()), path))
    return pts


def test_the_grid_has_three_kernel_counts_per_small_size():
    for size in DEFAULT_SIZES:
        counts = kernel_eligible_counts(size, KERNEL_COUNTS)
        assert counts == (list(KERNEL_COUNTS) if size < 28 * KIB else [])


def test_fit_recovers_the_kernel_launch_and_rate():
    h2d = fit(synthetic_points())["directions"][H2D]
    assert h2d["overhead_s"] == pytest.approx(OVERHEAD, rel=1e-9)
    assert h2d["kernel"]["launch_s"] == pytest.approx(LAUNCH, rel=1e-9)
    got = {int(k): v for k, v in h2d["kernel"]["curve_gbps"].items()}
    assert got == pytest.approx(KERNEL_GBPS, rel=1e-9)
    # the DMA curve is fitted from DMA points only (counts 1 and 8 at the small sizes)
    dma = {int(k): v for k, v in h2d["effective_gbps"].items()}
    assert dma == pytest.approx(
        {s: s / (PER_COPY + s / (r * 1e9)) / 1e9 for s, r in DMA_GBPS.items()}
    )
    assert sorted({c for _, c, _ in h2d["kernel_points"]}) == list(KERNEL_COUNTS)


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_the_kernel_within_one_percent_of_noisy_points(seed):
    h2d = fit(synthetic_points(noise=5e-4, seed=seed))["directions"][H2D]
    assert h2d["kernel"]["launch_s"] == pytest.approx(LAUNCH, rel=0.01)
    got = {int(k): v for k, v in h2d["kernel"]["curve_gbps"].items()}
    assert got == pytest.approx(KERNEL_GBPS, rel=0.01)


def test_stores_and_both_points_get_no_kernel_model():
    dirs = fit(synthetic_points())["directions"]
    assert "kernel" not in dirs[D2H] and "kernel" not in dirs[BOTH]
    assert dirs[BOTH]["kernel_points"]  # kept in the report all the same


def test_count_lines_are_one_fit_for_both_paths():
    """The DMA and kernel fits share :func:`fit_count_lines`: a size with one count has no
    separable fixed cost, and its time per copy is the mean."""
    pts = [Point(H2D, 4096, n, 2e-5 + n * 1e-6) for n in (1, 8, 64)] + [
        Point(H2D, 1 << 20, 1, 3e-5)
    ]
    lines = fit_count_lines(pts)
    assert lines[4096].per_copy == pytest.approx(1e-6) and lines[4096].fixed == pytest.approx(2e-5)
    assert lines[1 << 20].per_copy == 3e-5 and lines[1 << 20].fixed is None


def test_launch_below_the_dma_overhead_is_clamped_to_zero():
    dma = [Point(H2D, s, n, 20e-6 + n * s / 10e9, "copy_") for s in (4096, 65536) for n in (1, 8)]
    fast = [Point(H2D, 4096, n, 5e-6 + n * 4096 / 30e9, GatherKernel.name) for n in (16, 64)]
    kernel = fit(dma + fast)["directions"][H2D]["kernel"]
    assert kernel["launch_s"] == 0.0
    assert float(kernel["curve_gbps"]["4096"]) == pytest.approx(30.0, rel=1e-9)


def test_the_kernel_profile_round_trips_and_simulates_the_fitted_times(tmp_path):
    params = to_profile(fit(synthetic_points()), "synthetic")
    path = tmp_path / "profile.json"
    path.write_text(params.to_json())
    data = json.loads(path.read_text())
    assert set(data["h2d"]["kernel"]) == {"launch_s", "curve"} and "kernel" not in data["d2h"]
    loaded = load_transfer_profile(path)
    assert loaded == params
    assert loaded.h2d.kernel is not None
    assert loaded.h2d.kernel.launch_s == pytest.approx(LAUNCH, rel=1e-9)
    backend = SimulatedTransferBackend(loaded)
    job_id = 0
    for size in KERNEL_GBPS:
        for n in KERNEL_COUNTS:
            plan = loaded.h2d.plan(size * n, n)
            assert plan.path == KERNEL
            assert loaded.h2d.job_time(size * n, n) == pytest.approx(
                kernel_seconds(size, n), rel=1e-9
            )
            job_id += 1
            now = job_id * 1.0  # one job at a time: each runs alone on the link
            backend.submit(TransferJob(job_id, LOAD, [0], [0], size * n, n, submit_time=now), now)
            end, [res] = backend.wait([job_id], now)
            assert res.success
            assert end - now == pytest.approx(kernel_seconds(size, n), rel=1e-9)
        # fewer than 16 pages: the copy engine, at the DMA fit's costs
        assert loaded.h2d.plan(size * 8, 8).path == DMA
        assert loaded.h2d.job_time(size * 8, 8) == pytest.approx(
            OVERHEAD + 8 * (PER_COPY + size / (DMA_GBPS[size] * 1e9)), rel=1e-6
        )


def test_a_cpu_calibration_has_no_kernel_and_small_page_loads_simulate_as_dma(tmp_path):
    out, rep = tmp_path / "profile.json", tmp_path / "report.json"
    args = ["calibrate", "--out", str(out), "--device", "cpu", "--max-mib", "1"]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--repeats", "1", "--report", str(rep)])
    assert exc.value.code == 0
    report = json.loads(rep.read_text())
    h2d = report["directions"][H2D]
    assert "kernel" not in h2d and h2d["kernel_points"] == []
    assert list(report["point_paths"]) == ["copy_"]
    # the loads were still timed at the kernel counts (the grid is the same everywhere) ...
    counts_4k = sorted(n for s, n, _ in h2d["points"] if s == 4096)
    assert counts_4k == sorted({*DEFAULT_COUNTS, *KERNEL_COUNTS})
    # ... and fitted into the DMA curve, which then times every small-page load
    assert "kernel" not in json.loads(out.read_text())["h2d"]
    params = load_transfer_profile(out)
    assert params.h2d.kernel is None
    backend = SimulatedTransferBackend(params)
    for job_id, (page, n) in enumerate([(4096, 16), (8192, 64), (16384, 256)], start=1):
        assert load_uses_kernel(page, n)
        plan = params.h2d.plan(page * n, n)
        assert plan.path == DMA
        dma = params.h2d.overhead_s + n * params.h2d.per_copy_s + page * n / plan.rate
        assert plan.rate == params.h2d.bandwidth(page, n)
        now = 10.0 * job_id  # one job at a time: each runs alone on the link
        backend.submit(TransferJob(job_id, LOAD, [0], [0], page * n, n, submit_time=now), now)
        end, [res] = backend.wait([job_id], now)
        assert res.success and end - now == pytest.approx(dma, rel=1e-9)
