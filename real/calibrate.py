"""Calibration: measure the host<->GPU copy curve and fit the simulator's transfer model.

For every copy size (4 KiB to 64 MiB) and count of runs, one transfer of ``count``
separate runs of ``size`` bytes is timed with events on a side stream, H2D, D2H, and both
directions at once (two streams, timed from the first start to the last end). The median
of a few repeats is kept. The runs go through the device's copy path (one batched
``cuMemcpyBatchAsync`` on CUDA, ``copy_`` per run on CPU; :mod:`real.copy_path`), the one
the backend uses, so on CUDA the H2D points of 16 or more copies under 28 KiB go through
vLLM's Triton gather kernel when it resolved, as such loads would (each point records the
path that copied it: ``point_paths`` in the report). Both host buffers (the H2D source and
the D2H destination) are page-aligned pools page-locked like the backend's: a pageable D2H
destination would make a ``non_blocking`` copy synchronous and staged and measure the
wrong thing. The points
are then fitted per direction to

    seconds = latency + count * per_copy + bytes / bandwidth(size)

where ``bandwidth(size)`` is the measured curve (bytes per second of copy time for one
copy of that size). H2D points of sizes a load could send through the kernel are also
timed at ``KERNEL_COUNTS`` copies, so that each such size has several kernel-eligible
counts: the kernel points are fitted the same way, per size a line in ``count``, to

    seconds = overhead + launch + count * size / kernel_rate(size)

(the ``overhead`` of the H2D DMA fit; ``launch`` from the lines' intercepts). The result is
a plain dict; :func:`real.profile.to_profile` turns it into the link model (the profile
JSON) that the simulator loads, with an H2D ``kernel`` entry only when kernel points exist.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvsim.engine.copy_paths import load_uses_kernel
from real.copy_path import CopyPath, Run
from real.device import Device, Event, Stream
from real.host_pool import HostLayout, HostPool, Register, Unregister
from real.kv_cache import KVGeometry
from real.lifetime import release_when_idle
from real.machine import check_device_fits, check_fits
from real.profile import to_profile
from real.triton_load import GatherKernel

if TYPE_CHECKING:
    from kvsim.engine.transfer_model import TransferModelParams

KIB = 1024
MIB = 1024 * 1024
DEFAULT_SIZES = tuple(4 * KIB << i for i in range(15))  # 4 KiB .. 64 MiB
DEFAULT_COUNTS = (1, 8, 64)
# H2D counts added at sizes where a load of that many copies takes the gather kernel
# (under 28 KiB, 16 copies or more): three kernel points per size separate the launch from
# the rate (at most 256 x 16 KiB = 4 MiB a transfer, well under a second on CPU)
KERNEL_COUNTS = (16, 64, 256)
# on CPU the buffers walked through are this many times the largest transfer, so copies
# miss even a large last-level cache (4 x 128 MiB per buffer, 2 GiB in all, by default)
CPU_COLD_SPAN_FACTOR = 4
H2D, D2H, BOTH = "h2d", "d2h", "both"

# (dst, src, words per copy, copies, source stable (an H2D read of host memory), offset)
Plan = tuple[torch.Tensor, torch.Tensor, int, int, bool, int]


@dataclass(frozen=True)
class Pinning:
    """How the calibration's host buffers are page-locked (``register``: tests)."""

    pin: bool
    require: bool = False
    register: Register | None = None
    unregister: Unregister | None = None

    def pool(self, nbytes: int) -> HostPool:
        return HostPool(
            HostLayout(KVGeometry(1, 4096), 1),
            max(1, nbytes // 4096),
            pin=self.pin,
            require_pin=self.require,
            register=self.register,
            unregister=self.unregister,
        )


@dataclass(frozen=True)
class Point:
    """One calibrated transfer: ``count`` copies of ``size`` bytes took ``seconds``."""

    direction: str  # h2d, d2h or both
    size: int  # bytes per copy
    count: int  # copies per transfer (per direction for "both")
    seconds: float  # median wall time of the transfer on the device
    path: str = ""  # the copy path of its H2D copies (of its D2H ones for d2h)

    @property
    def nbytes(self) -> int:
        return self.size * self.count * (2 if self.direction == BOTH else 1)

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


def _buffers(
    device: Device, max_bytes: int, pinning: Pinning
) -> tuple[list[HostPool], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pools, H2D host source, D2H host destination, GPU destination, GPU source)."""
    words = max_bytes // 8
    pools: list[HostPool] = []
    try:
        for _ in range(2):
            pools.append(pinning.pool(max_bytes))
    except BaseException:
        for p in pools:
            p.close()
        raise
    h2d_src, d2h_dst = pools[0].data[:words], pools[1].data[:words]
    h2d_src.fill_(1)
    d2h_dst.fill_(3)
    gpu_a = device.empty((words,), torch.int64)
    gpu_b = device.empty((words,), torch.int64)
    gpu_a.fill_(2)
    gpu_b.fill_(4)
    return pools, h2d_src, d2h_dst, gpu_a, gpu_b


def calibration_bytes(device: Device, span: int) -> tuple[int, int]:
    """``(host, device)`` bytes :func:`_buffers` allocates for a ``span``-byte walk: two host
    pools and two device buffers of ``span`` each (on CPU the device's are host memory)."""
    pools, buffers = 2 * span, 2 * span
    return (pools, buffers) if device.is_cuda else (pools + buffers, 0)


def check_calibration_fits(device: Device, max_bytes: int, span: int) -> None:
    """Refuse (one line, naming ``--max-mib``) a calibration whose buffers the machine
    cannot hold, before any is allocated."""
    host, on_device = calibration_bytes(device, span)
    what = f"calibrating copies of up to {max_bytes / MIB:,.0f} MiB (--max-mib)"
    hint = "use a smaller --max-mib"
    check_fits(host, what, hint=hint)
    check_device_fits(on_device, device.torch_device, what, hint)


def _runs(words: int, count: int, offset: int = 0) -> list[Run]:
    return [(offset + i * words, offset + i * words, words) for i in range(count)]


def _time_once(
    device: Device, streams: Sequence[Stream], plans: Sequence[Plan], path: CopyPath
) -> float:
    """Run each plan on its stream; first start to last end, measured between events
    (``end.seconds_since(start)``, never a difference of absolute event times)."""
    starts: list[Event] = []
    ends: list[Event] = []
    for stream, (dst, src, w, n, stable, off) in zip(streams, plans):
        s, e = device.new_event(), device.new_event()
        stream.wait_stream(device.compute_stream)
        s.record(stream)
        path.copy(dst, src, _runs(w, n, off), stream=stream, stable_source=stable)
        e.record(stream)
        starts.append(s)
        ends.append(e)
    for e in ends:
        e.synchronize()
    return max(e.seconds_since(s) for e in ends for s in starts)


def kernel_eligible_counts(size: int, kernel_counts: Sequence[int]) -> list[int]:
    """The counts of ``kernel_counts`` at which a load of ``size``-byte copies would go
    through vLLM's gather kernel (where the device has it)."""
    return [c for c in kernel_counts if load_uses_kernel(size, c)]


def measure(
    device: Device,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    counts: Sequence[int] = DEFAULT_COUNTS,
    kernel_counts: Sequence[int] = KERNEL_COUNTS,
    max_bytes: int = 256 * MIB,
    repeats: int = 5,
    directions: Sequence[str] = (H2D, D2H, BOTH),
    pin: bool | None = None,
    require_pin: bool = False,
    register: Register | None = None,
    unregister: Unregister | None = None,
    copy_path: CopyPath | None = None,
    span_bytes: int | None = None,
) -> tuple[list[Point], bool]:
    """Time the copy grid; returns the points and whether host memory was pinned.

    H2D is also timed at each of ``kernel_counts`` for which a load of that size would take
    the gather kernel (:func:`kernel_eligible_counts`), whatever path the device has, so the
    grid is the same on every device.

    Successive transfers walk through buffers of ``span_bytes`` (default ``max_bytes``)
    instead of reusing the same bytes: a span larger than the CPU's last-level cache
    makes a CPU run copy cold memory, as the backend's jobs do."""
    pin = device.is_cuda if pin is None else pin
    path = copy_path or device.copy_path()
    pinning = Pinning(pin, require_pin and pin, register, unregister)
    span = max(max_bytes, span_bytes or 0)
    span_words = span // 8
    check_calibration_fits(device, max_bytes, span)
    pools, h2d_src, d2h_dst, gpu_a, gpu_b = _buffers(device, span, pinning)
    offset = 0

    def plans(d: str, w: int, count: int) -> tuple[list[Stream], list[Plan]]:
        """The streams and plans of one transfer, at the next offset of the walk."""
        nonlocal offset
        if offset + w * count > span_words:
            offset = 0
        off, offset = offset, offset + w * count
        load: Plan = (gpu_a, h2d_src, w, count, True, off)
        store: Plan = (d2h_dst, gpu_b, w, count, False, off)
        if d == H2D:
            return [h2d_s], [load]
        if d == D2H:
            return [d2h_s], [store]
        return [h2d_s, d2h_s], [load, store]

    h2d_s, d2h_s = device.stream("calibrate-h2d"), device.stream("calibrate-d2h")
    try:
        points = []
        for size in sizes:
            w = max(1, size // 8)
            path.prepare(w * 8, device.torch_device)  # compile a kernel tile before timing
            extra = kernel_eligible_counts(w * 8, kernel_counts)
            for count in sorted(set(counts) | set(extra)):
                if size * count > max_bytes:
                    continue
                # the added counts are for the kernel fit: loads only
                for d in directions if count in counts else [d for d in directions if d == H2D]:
                    _time_once(device, *plans(d, w, count), path)  # warm-up
                    times = [_time_once(device, *plans(d, w, count), path) for _ in range(repeats)]
                    dst, src = (d2h_dst, gpu_b) if d == D2H else (gpu_a, h2d_src)
                    route = path.route(dst, src, _runs(w, count), None)
                    points.append(Point(d, w * 8, count, statistics.median(times), route))
        return points, all(p.pinned for p in pools)
    finally:
        release_when_idle(device, pools[1], gpu_a, gpu_b, pools[0])
        pools[0].close()


@dataclass(frozen=True)
class CountLine:
    """Transfers of one copy size: ``seconds = fixed + count * per_copy``, least squares
    over the counts measured. ``fixed`` is None where it could not be separated (one count
    only, or a non-positive slope from noise: then ``per_copy`` is the mean time per copy)."""

    per_copy: float
    fixed: float | None


def fit_count_lines(points: Sequence[Point]) -> dict[int, CountLine]:
    """One :class:`CountLine` per copy size of ``points`` (of one direction and path)."""
    lines: dict[int, CountLine] = {}
    for size in sorted({p.size for p in points}):
        sp = [p for p in points if p.size == size]
        counts = np.array([p.count for p in sp], dtype=float)
        secs = np.array([p.seconds for p in sp], dtype=float)
        slope, intercept = 0.0, 0.0
        if len(set(counts)) >= 2:
            slope, intercept = (float(v) for v in np.polyfit(counts, secs, 1))
        if slope <= 0:  # one count, or noise at tiny sizes: the mean time per copy
            lines[size] = CountLine(float(np.sum(secs) / np.sum(counts)), None)
        else:
            lines[size] = CountLine(slope, intercept)
    return lines


def fit_kernel(points: Sequence[Point], overhead_s: float) -> dict[str, Any]:
    """The gather kernel's model from loads it timed: ``seconds = overhead_s + launch_s +
    count * size / rate(size)``. ``launch_s`` is the median of the separable intercepts
    less the DMA fit's ``overhead_s`` (the model charges both; 0 when no size had two
    counts or the kernel's fixed cost came out below the DMA one)."""
    lines = fit_count_lines(points)
    fixed = [ln.fixed for ln in lines.values() if ln.fixed is not None]
    launch = max(float(np.median(fixed)) - overhead_s, 0.0) if fixed else 0.0
    return {
        "launch_s": launch,
        "curve_gbps": {str(s): s / ln.per_copy / 1e9 for s, ln in lines.items()},
    }


def fit(points: Sequence[Point]) -> dict[str, Any]:
    """Per direction and size, ``seconds = overhead + count * (per_copy + size / rate(size))``.

    With several counts per size a line is fitted in ``count`` (:func:`fit_count_lines`):
    its slope is the time of one copy of that size, its intercept the fixed cost of a
    transfer (``overhead_s`` is the median intercept). ``per_copy_s`` is the intercept of
    copy time against copy size over the small sizes; the curve is what remains
    (``effective_gbps`` keeps the rate with the per-copy cost included), so the model
    reproduces every calibrated point. H2D points timed through the gather kernel are
    fitted apart into ``kernel`` (:func:`fit_kernel`). ``duplex_factor`` is the aggregate
    rate with both directions busy over the sum of the one-way rates, for copies of 1 MiB
    and more.
    """
    out: dict[str, Any] = {"directions": {}}
    for d in (H2D, D2H, BOTH):
        # the copy-engine curve from DMA points only: a load timed through the gather
        # kernel is another path (kept apart as ``kernel_points``)
        kernel = [p for p in points if p.direction == d and p.path == GatherKernel.name]
        pts = [p for p in points if p.direction == d and p.path != GatherKernel.name]
        if not pts:
            continue
        lines = fit_count_lines(pts)
        slopes = {s: ln.per_copy for s, ln in lines.items()}
        intercepts = [max(ln.fixed or 0.0, 0.0) for ln in lines.values()]
        # per-copy cost: the intercept of copy time against copy size (small sizes), so
        # copies smaller than the smallest calibrated size are not predicted as free
        small = [s for s in slopes if s <= 256 * KIB] or list(slopes)
        per_copy = 0.0
        if len(small) >= 2:
            a = float(
                np.polyfit(np.array(small, float), np.array([slopes[s] for s in small]), 1)[1]
            )
            per_copy = min(max(a, 0.0), 0.9 * min(slopes.values()))
        mult = 2 if d == BOTH else 1
        curve = {s: mult * s / (t - per_copy) / 1e9 for s, t in slopes.items()}
        out["directions"][d] = {
            "curve_gbps": {str(k): v for k, v in curve.items()},
            "effective_gbps": {str(s): mult * s / t / 1e9 for s, t in slopes.items()},
            "peak_gbps": max(mult * s / t / 1e9 for s, t in slopes.items()),
            "per_copy_s": per_copy,
            "overhead_s": float(np.median(intercepts)),
            "points": [[p.size, p.count, p.seconds] for p in pts],
            "kernel_points": [[p.size, p.count, p.seconds] for p in kernel],
        }
        if d == H2D and kernel:  # the simulator models the kernel for loads only
            out["directions"][d]["kernel"] = fit_kernel(kernel, out["directions"][d]["overhead_s"])
    dirs = out["directions"]
    if all(d in dirs for d in (H2D, D2H, BOTH)):
        ratios = []
        eff = {d: dirs[d]["effective_gbps"] for d in (H2D, D2H, BOTH)}
        for k, both in eff[BOTH].items():
            if int(k) >= MIB and k in eff[H2D] and k in eff[D2H]:
                ratios.append(both / (eff[H2D][k] + eff[D2H][k]))
        if ratios:
            out["duplex_factor"] = float(min(max(np.median(ratios), 1e-3), 1.0))
    return out


def calibrate(
    device: Device, *, link: str | None = None, **measure_kwargs: Any
) -> tuple[TransferModelParams, dict[str, Any]]:
    """Measure and fit; returns ``(TransferModelParams, report)``."""
    path = measure_kwargs.pop("copy_path", None) or device.copy_path()
    points, pinned = measure(device, copy_path=path, **measure_kwargs)
    fitted = fit(points)
    fitted["copy_path"] = path.name
    by_path: dict[str, list[list[Any]]] = {}
    for p in points:
        by_path.setdefault(p.path, []).append([p.direction, p.size, p.count])
    fitted["point_paths"] = by_path
    name = link or (
        "cuda-" + torch.cuda.get_device_name(device.torch_device)
        if device.is_cuda
        else "cpu-emulated"
    )
    fitted["pinned"] = pinned
    fitted["device"] = device.kind
    return to_profile(fitted, name), fitted


def gbps_at_least(fitted: dict[str, Any], direction: str, min_size: int) -> float | None:
    """The lowest effective bandwidth measured for copies of ``min_size`` bytes or more."""
    d = fitted["directions"].get(direction)
    if d is None:
        return None
    vals = [v for k, v in d["effective_gbps"].items() if int(k) >= min_size]
    return min(vals) if vals else None
