"""Transfer cost model: how long one GPU<->CPU copy job takes on a given link.

A job moves ``nbytes`` as ``copies`` equal pages (one descriptor per GPU block and layer,
``page = nbytes / copies``). It takes the path vLLM 0.33 picks for it
(:func:`kvsim.engine.copy_paths.load_uses_kernel`): CPU->GPU jobs of small pages go through
a Triton gather kernel when the link has a ``kernel`` model; everything else, stores always,
through the copy engine (one ``cuMemcpyBatchAsync`` per job)::

    DMA:    job_time = copies * per_copy_s + overhead_s + nbytes / rate(page, copies)
    kernel: job_time = launch_s            + overhead_s + nbytes / kernel_rate(page)

``copies * per_copy_s`` and ``launch_s`` are host time: the driver call (about 0.5 us per
descriptor, vLLM PR #48434) or the kernel launch, spent from the job's submission on the one
worker thread; ``overhead_s`` is the per-job stream and event latency. ``rate(page, N)`` is
the copy itself, without the host time: a curve in page size (linear, clamped at both ends),
or several curves keyed by the descriptor count N, interpolated linearly in log N and
clamped outside the keyed counts (the small-page DMA cliff deepens with N, PR #42212). When
both directions move bytes each runs at ``duplex_factor`` of its one-way rate (about 80 GB/s
aggregate on Gen5, not 100).

Calibration profile JSON (written by ``kvsim calibrate``, read by ``load_transfer_profile``)::

    {
      "version": 1,
      "link": "h200-measured",                 # free-form name
      "h2d": {"overhead_s": 2e-05, "per_copy_s": 5e-07,
              "curve": [[4096, 3.8], [65536, 50.0]],      # [page_bytes, GB/s (1e9 B/s)]
              "kernel": {"launch_s": 3.5e-05,              # optional, h2d only
                         "curve": [[4096, 35.0]]}},        # [page_bytes, GB/s]
      "d2h": {...same fields, no kernel...},
      "duplex_factor": 0.8                      # optional, default 0.8, in (0, 1]
    }

Instead of ``curve`` a direction may give ``"curves": [{"descriptors": 10000, "curve":
[...]}, {"descriptors": 50000, "curve": [...]}]`` (increasing counts). Curve points must have
increasing sizes > 0 and rates > 0. Without a ``kernel`` every load is DMA (what a real
backend without vLLM's Triton path does); unknown keys are errors. The file is described
once, with its bounds and help, by :mod:`kvsim.engine.link_file` (``kvsim schema
link-profile``); the classes here are the checked values the engine runs.

The simplest link, for setting a run side by side with another simulator or with vLLM's
own scheduler under one trivial time model (each job takes bytes / rate, no overhead, no
kernel, the two directions independent, each queue FIFO)::

    {"kind": "constant", "h2d_bytes_per_s": 2.5e10, "d2h_bytes_per_s": 2.5e10}
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.io import read_json
from kvsim.engine.copy_paths import load_uses_kernel
from kvsim.engine.link_file import (
    PROFILE_VERSION,
    ConstantLinkFile,
    DirectionFile,
    LinkKind,
    LinkProfileFile,
)
from kvsim.options.schema import load

GB = 1e9
DMA = "dma"
KERNEL = "kernel"

Curve = tuple[tuple[float, float], ...]  # (page_bytes, GB/s), increasing page_bytes


def _interpolate(curve: Curve, x: float) -> float:
    """GB/s at ``x``: linear between points, clamped at both ends."""
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    i = bisect_left([s for s, _ in curve], x)
    (s0, r0), (s1, r1) = curve[i - 1], curve[i]
    return r0 + (r1 - r0) * (x - s0) / (s1 - s0)


@dataclass(frozen=True)
class KernelParams:
    """vLLM's Triton gather kernel for small CPU->GPU pages: a launch, then bytes at a rate
    that depends on the page size only (it copies pages in parallel on a fixed SM slice)."""

    launch_s: float
    curve: Curve  # (page_bytes, GB/s)

    def rate(self, page_bytes: float) -> float:
        """Bytes per second for pages of ``page_bytes``."""
        return _interpolate(self.curve, page_bytes) * GB

    def to_dict(self) -> dict[str, Any]:
        return {"launch_s": self.launch_s, "curve": [[s, r] for s, r in self.curve]}


@dataclass(frozen=True)
class CopyPlan:
    """How one job runs alone on the link: its path, host time from submission, latency
    once its queue reaches it, and rate while it moves bytes."""

    path: str  # DMA or KERNEL
    host_s: float
    fixed_s: float
    rate: float  # bytes per second

    def time(self, nbytes: float) -> float:
        return self.host_s + self.fixed_s + nbytes / self.rate


@dataclass(frozen=True)
class DirectionParams:
    """Cost coefficients of one copy direction: ``curve`` (any descriptor count) or
    ``curves`` (keyed by descriptor count), and for loads optionally a ``kernel``."""

    overhead_s: float
    per_copy_s: float
    curve: Curve = ()
    curves: tuple[tuple[float, Curve], ...] = ()  # (descriptors, curve), increasing
    kernel: KernelParams | None = None
    _table: tuple[tuple[float, Curve], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_table", self.curves or ((1.0, self.curve),))

    def bandwidth(self, copy_bytes: float, descriptors: float = 1) -> float:
        """DMA bytes per second for ``descriptors`` pages of ``copy_bytes``."""
        table = self._table
        if len(table) == 1 or descriptors <= table[0][0]:
            return _interpolate(table[0][1], copy_bytes) * GB
        if descriptors >= table[-1][0]:
            return _interpolate(table[-1][1], copy_bytes) * GB
        i = bisect_left([n for n, _ in table], descriptors)
        (n0, c0), (n1, c1) = table[i - 1], table[i]
        w = math.log(descriptors / n0) / math.log(n1 / n0)
        r0, r1 = _interpolate(c0, copy_bytes), _interpolate(c1, copy_bytes)
        return (r0 + (r1 - r0) * w) * GB

    @property
    def peak_gbps(self) -> float:
        """The highest rate any job can move at (DMA or kernel), GB/s."""
        curves = [c for _, c in self._table] + ([self.kernel.curve] if self.kernel else [])
        return max(rate for c in curves for _, rate in c)

    def plan(self, nbytes: float, copies: int) -> CopyPlan:
        """The path and costs of a job of ``copies`` equal pages totalling ``nbytes``."""
        copies = max(1, copies)
        page = nbytes / copies
        if self.kernel is not None and load_uses_kernel(math.ceil(page), copies):
            return CopyPlan(KERNEL, self.kernel.launch_s, self.overhead_s, self.kernel.rate(page))
        return CopyPlan(
            DMA, copies * self.per_copy_s, self.overhead_s, self.bandwidth(page, copies)
        )

    def job_time(self, nbytes: float, copies: int) -> float:
        """Time of one job running alone on the link."""
        return self.plan(nbytes, copies).time(nbytes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"overhead_s": self.overhead_s, "per_copy_s": self.per_copy_s}
        if self.curves:
            out["curves"] = [
                {"descriptors": int(n) if n.is_integer() else n, "curve": [[s, r] for s, r in c]}
                for n, c in self.curves
            ]
        else:
            out["curve"] = [[s, r] for s, r in self.curve]
        if self.kernel is not None:
            out["kernel"] = self.kernel.to_dict()
        return out

    @classmethod
    def from_file(cls, d: DirectionFile) -> DirectionParams:
        """One direction of a checked profile file."""
        kernel = None if d.kernel is None else KernelParams(d.kernel.launch_s, d.kernel.curve)
        curves = tuple((c.descriptors, c.curve) for c in d.curves or ())
        return cls(d.overhead_s, d.per_copy_s, d.curve or (), curves, kernel)


@dataclass(frozen=True)
class TransferModelParams:
    """A link: load (h2d) and store (d2h) directions plus full-duplex sharing."""

    link: str
    h2d: DirectionParams
    d2h: DirectionParams
    duplex_factor: float = 0.8

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION,
            "link": self.link,
            "h2d": self.h2d.to_dict(),
            "d2h": self.d2h.to_dict(),
            "duplex_factor": self.duplex_factor,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Any, source: str = "transfer profile") -> TransferModelParams:
        """A link file's object (:mod:`kvsim.engine.link_file`): a calibration profile, or
        a ``{"kind": "constant"}`` link; any error is one line naming ``source``."""
        if load(LinkKind, data, source=source).kind == "constant":
            return constant_link(data, source)
        f = load(LinkProfileFile, data, source=source)
        return cls(
            f.link,
            DirectionParams.from_file(f.h2d),
            DirectionParams.from_file(f.d2h),
            f.duplex_factor,
        )


def constant_link(data: Any, source: str = "link") -> TransferModelParams:
    """``{"kind": "constant", "h2d_bytes_per_s": X, "d2h_bytes_per_s": Y}``: bytes / rate."""
    f = load(ConstantLinkFile, data, source=source)

    def direction(rate: float) -> DirectionParams:
        return DirectionParams(0.0, 0.0, ((1.0, rate / GB),))

    return TransferModelParams(
        f.link, direction(f.h2d_bytes_per_s), direction(f.d2h_bytes_per_s), duplex_factor=1.0
    )


def load_transfer_profile(path: str | os.PathLike[str]) -> TransferModelParams:
    """Read a calibration profile (schema in this module's docstring)."""
    path = os.fspath(path)
    return TransferModelParams.from_dict(read_json(path), source=path)


# --- presets -------------------------------------------------------------------------------

# Host time of cuMemcpyBatchAsync per descriptor: vLLM PR #48434 (H100 PCIe Gen5, x86 host):
# 6.33 ms to enqueue 12,288 descriptors (0.52 us); 5.15 ms for 8,192 (0.63 us).
HOST_S_PER_DESCRIPTOR = 0.5e-6

# vLLM PR #42212 (H100 PCIe Gen5): one cuMemcpyBatchAsync of N CPU->GPU pages, GB/s per call
# (submission included), by page size.
PR42212_H2D_PER_CALL: dict[int, Curve] = {
    10_000: ((4096, 6.8), (8192, 6.8), (16384, 7.1), (24576, 25.8), (28672, 27.5), (65536, 38.8)),
    50_000: ((4096, 4.0), (8192, 5.2), (16384, 6.3), (24576, 6.7), (28672, 39.9), (65536, 51.4)),
    100_000: ((4096, 3.8), (8192, 5.3), (16384, 6.3), (24576, 6.9), (28672, 44.1), (65536, 51.8)),
}
# Copy-engine ceiling one way on Gen5: 54.1 GB/s, 128 KiB runs back to back (PR #48434).
_GEN5_CEILING_GBPS = 54.1
# PCIe Gen4 x16 (A100, A30, L40S): 25-26 GB/s one way measured (docs/transfer-hardware.md).
_GEN4_CEILING_GBPS = 26.0


def _copy_rates(per_call: Curve, ceiling_gbps: float, scale: float = 1.0) -> Curve:
    """Rates of the copy itself from per-call rates that include the host submission: each
    page costs ``page / rate - HOST_S_PER_DESCRIPTOR`` on the link, capped at the ceiling.
    With ``per_copy_s = HOST_S_PER_DESCRIPTOR`` the model then reproduces every call below
    the ceiling. (At N >= 50,000 the per-call rates of 28-64 KiB pages are above what a
    serial submission allows, so the driver overlapped it there; the model, serial, is
    slower for those: 28 GB/s at 28 KiB and 38 GB/s at 64 KiB against 40-44 and 51-52.)"""
    out = []
    for page, gbps in per_call:
        link_s = page / (gbps * scale * GB) - HOST_S_PER_DESCRIPTOR
        rate = page / link_s / GB if link_s > 0 else math.inf
        out.append((float(page), min(rate, ceiling_gbps)))
    return tuple(out)


def _keyed(ceiling_gbps: float, scale: float = 1.0) -> tuple[tuple[float, Curve], ...]:
    return tuple(
        (float(n), _copy_rates(c, ceiling_gbps, scale)) for n, c in PR42212_H2D_PER_CALL.items()
    )


# Stores: PR #42212 measured loads only; the Gen5 store curve keeps the old (load-shaped)
# cliff, about 50 GB/s for >= 64 KiB one way (vLLM blog 2026-01-08, H100).
_GEN5_D2H_CURVE = ((4096.0, 3.8), (16384.0, 6.3), (24576.0, 6.9), (28672.0, 44.0), (65536.0, 50.0))
_GEN4_D2H_CURVE = ((4096.0, 2.0), (16384.0, 3.2), (24576.0, 3.5), (28672.0, 22.0), (65536.0, 25.0))

# Triton kernel on H100/H200 PCIe Gen5. Rate: 35 GB/s, an SM-driven H2D copy on H100
# (NVIDIA/nvbandwidth issue #24; the vLLM blog saw up to ~50 GB/s for its own SM kernel),
# flat in page size (vLLM: 12 SMs are within 5% of peak from 8 to 32 KiB pages; issue
# #57555's A30 ratios are flat from 1 to 24 KiB at N = 4,096, as is the DMA rate they divide).
# Launch: 35 us, the Triton arm's time at N = 16-32 on a GB10 (PR #57569: 38-47 us), inside
# the 16-62 us that the H100 8 KiB crossover between N = 16 and 64 (PR #57343 review) needs
# under this module's DMA model.
_GEN5_KERNEL = KernelParams(35e-6, ((4096.0, 35.0),))
# Gen4: fitted to issue #57555's A30 table (DMA time / Triton time, N = 16-4,096) against
# this preset's DMA model: at N = 4,096 the ratios 3.7-4.5 (4-16 KiB) times its 3.4-3.6 GB/s
# give 13-15 GB/s; the crossovers (ratio 1 near N = 22-45) give a 40-75 us launch. The model
# then matches the 4-16 KiB ratios within about 25%.
_GEN4_KERNEL = KernelParams(55e-6, ((4096.0, 14.0),))

LINK_PRESETS: dict[str, TransferModelParams] = {
    "pcie5": TransferModelParams(
        "pcie5",
        DirectionParams(
            20e-6, HOST_S_PER_DESCRIPTOR, curves=_keyed(_GEN5_CEILING_GBPS), kernel=_GEN5_KERNEL
        ),
        DirectionParams(20e-6, HOST_S_PER_DESCRIPTOR, _GEN5_D2H_CURVE),
        duplex_factor=0.8,
    ),
    # Gen4: the Gen5 load table scaled by 0.5 (~25 GB/s one way), not measured on Gen4.
    "pcie4": TransferModelParams(
        "pcie4",
        DirectionParams(
            20e-6,
            HOST_S_PER_DESCRIPTOR,
            curves=_keyed(_GEN4_CEILING_GBPS, scale=0.5),
            kernel=_GEN4_KERNEL,
        ),
        DirectionParams(20e-6, HOST_S_PER_DESCRIPTOR, _GEN4_D2H_CURVE),
        duplex_factor=0.8,
    ),
    # Grace-Hopper NVLink-C2C: copy-engine H2D 342, D2H 295 GB/s (vLLM PR #6496). No source
    # for the Triton kernel or the host cost on a Grace CPU: DMA only, old per-copy cost.
    "gh200": TransferModelParams(
        "gh200",
        DirectionParams(10e-6, 0.02e-6, ((4096.0, 30.0), (65536.0, 250.0), (2097152.0, 342.0))),
        DirectionParams(10e-6, 0.02e-6, ((4096.0, 30.0), (65536.0, 220.0), (2097152.0, 295.0))),
        duplex_factor=0.8,
    ),
}


def get_link(name_or_path: str | os.PathLike[str]) -> TransferModelParams:
    """A preset by name, or a calibration profile (or constant link) JSON by path."""
    name_or_path = os.fspath(name_or_path)
    key = name_or_path.strip().lower()
    if key in LINK_PRESETS:
        return LINK_PRESETS[key]
    if os.path.exists(name_or_path):
        return load_transfer_profile(name_or_path)
    raise InputError(
        f"unknown link {name_or_path!r}; known: {', '.join(LINK_PRESETS)} or a profile JSON path"
    )
