"""Transfer cost model: how long one GPU<->CPU copy job takes on a given link.

Per direction (``h2d`` = load, ``d2h`` = store)::

    job_time = overhead_s + copies * per_copy_s + bytes / bandwidth(bytes / copies)

``bandwidth(copy_bytes)`` interpolates a measured curve linearly in copy size (clamped at
both ends); the curve carries the small-copy DMA cliff of docs/transfer-hardware.md (PR
#42212: 4-24 KiB descriptors at 4-7 GB/s, about 44 GB/s from 28 KiB, about 50 GB/s from
64 KiB on PCIe Gen5). When both directions move bytes at the same time each runs at
``duplex_factor`` of its one-way rate (about 80 GB/s aggregate on Gen5, not 100).

Calibration profile JSON (written by ``kvsim calibrate``, read by ``load_transfer_profile``)::

    {
      "version": 1,
      "link": "h200-measured",                 # free-form name
      "h2d": {"overhead_s": 2e-05, "per_copy_s": 5e-08,
              "curve": [[4096, 3.8], [65536, 50.0]]},   # [copy_bytes, GB/s (1e9 B/s)]
      "d2h": {...same fields...},
      "duplex_factor": 0.8                      # optional, default 0.8, in (0, 1]
    }

Curve points must have increasing ``copy_bytes`` > 0 and rates > 0.

The simplest link, for setting a run side by side with another simulator or with vLLM's
own scheduler under one trivial time model (each job takes bytes / rate, no overhead, the
two directions independent, each queue FIFO)::

    {"kind": "constant", "h2d_bytes_per_s": 2.5e10, "d2h_bytes_per_s": 2.5e10}
"""

from __future__ import annotations

import json
import os
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from kvsim.errors import InputError
from kvsim.io import read_json

PROFILE_VERSION = 1
GB = 1e9


@dataclass(frozen=True)
class DirectionParams:
    """Cost coefficients of one copy direction."""

    overhead_s: float
    per_copy_s: float
    curve: tuple[tuple[float, float], ...]  # (copy_bytes, GB/s), increasing copy_bytes

    def __post_init__(self) -> None:
        if self.overhead_s < 0 or self.per_copy_s < 0:
            raise InputError("transfer profile: overhead_s and per_copy_s must be >= 0")
        if not self.curve:
            raise InputError("transfer profile: curve needs at least one [copy_bytes, GBps] point")
        last = 0.0
        for size, rate in self.curve:
            if size <= last or rate <= 0:
                raise InputError(
                    "transfer profile: curve sizes must increase and rates be > 0, "
                    f"got [{size}, {rate}]"
                )
            last = size

    def bandwidth(self, copy_bytes: float) -> float:
        """Bytes per second for copies of ``copy_bytes`` (linear between curve points)."""
        curve = self.curve
        if copy_bytes <= curve[0][0]:
            return curve[0][1] * GB
        if copy_bytes >= curve[-1][0]:
            return curve[-1][1] * GB
        i = bisect_left([s for s, _ in curve], copy_bytes)
        (s0, r0), (s1, r1) = curve[i - 1], curve[i]
        return (r0 + (r1 - r0) * (copy_bytes - s0) / (s1 - s0)) * GB

    def fixed_time(self, copies: int) -> float:
        return self.overhead_s + copies * self.per_copy_s

    def job_time(self, nbytes: int, copies: int) -> float:
        """Time of one job running alone on the link."""
        copies = max(1, copies)
        return self.fixed_time(copies) + nbytes / self.bandwidth(nbytes / copies)

    def to_dict(self) -> dict[str, Any]:
        return {
            "overhead_s": self.overhead_s,
            "per_copy_s": self.per_copy_s,
            "curve": [[s, r] for s, r in self.curve],
        }


@dataclass(frozen=True)
class TransferModelParams:
    """A link: load (h2d) and store (d2h) directions plus full-duplex sharing."""

    link: str
    h2d: DirectionParams
    d2h: DirectionParams
    duplex_factor: float = 0.8

    def __post_init__(self) -> None:
        if not 0 < self.duplex_factor <= 1:
            raise InputError(
                f"transfer profile: duplex_factor must be in (0, 1], got {self.duplex_factor}"
            )

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
    def from_dict(
        cls, data: dict[str, Any], source: str = "transfer profile"
    ) -> TransferModelParams:
        if not isinstance(data, dict):
            raise InputError("expected a JSON object", source=source)
        if data.get("kind") == "constant":
            return constant_link(data, source)
        if data.get("version") != PROFILE_VERSION:
            raise InputError(
                f"unsupported version {data.get('version')!r} (expected {PROFILE_VERSION})",
                source=source,
            )
        try:
            dirs = {}
            for name in ("h2d", "d2h"):
                d = data[name]
                dirs[name] = DirectionParams(
                    float(d["overhead_s"]),
                    float(d["per_copy_s"]),
                    tuple((float(s), float(r)) for s, r in d["curve"]),
                )
            return cls(
                str(data.get("link", "profile")),
                dirs["h2d"],
                dirs["d2h"],
                float(data.get("duplex_factor", 0.8)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InputError):
                raise InputError(str(exc), source=source) from None
            raise InputError(
                f"malformed profile ({type(exc).__name__}: {exc})", source=source
            ) from None


def constant_link(data: dict[str, Any], source: str = "link") -> TransferModelParams:
    """``{"kind": "constant", "h2d_bytes_per_s": X, "d2h_bytes_per_s": Y}``: bytes / rate."""
    unknown = sorted(set(data) - {"kind", "h2d_bytes_per_s", "d2h_bytes_per_s", "link"})
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(unknown)} for a constant link", source=source)
    rates = {}
    for name in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise InputError(f"{name} must be a positive number, got {value!r}", source=source)
        if value == float("inf"):
            raise InputError(f"{name} must be finite", source=source)
        rates[name] = float(value)

    def direction(rate: float) -> DirectionParams:
        return DirectionParams(0.0, 0.0, ((1.0, rate / GB),))

    return TransferModelParams(
        str(data.get("link", "constant")),
        direction(rates["h2d_bytes_per_s"]),
        direction(rates["d2h_bytes_per_s"]),
        duplex_factor=1.0,
    )


def load_transfer_profile(path: str | os.PathLike[str]) -> TransferModelParams:
    """Read a calibration profile (schema in this module's docstring)."""
    path = os.fspath(path)
    return TransferModelParams.from_dict(read_json(path), source=path)


# PCIe Gen5 x16 (H100/H200): DMA small-descriptor cliff from vLLM PR #42212, about 50 GB/s
# one way for >= 64 KiB copies, about 80 GB/s both ways (vLLM blog: 83.4).
_GEN5_CURVE = ((4096.0, 3.8), (16384.0, 6.3), (24576.0, 6.9), (28672.0, 44.0), (65536.0, 50.0))
# PCIe Gen4 x16 (A100, L40S): 25-26 GB/s one way measured; same cliff shape, scaled.
_GEN4_CURVE = ((4096.0, 2.0), (16384.0, 3.2), (24576.0, 3.5), (28672.0, 22.0), (65536.0, 25.0))

LINK_PRESETS: dict[str, TransferModelParams] = {
    "pcie5": TransferModelParams(
        "pcie5",
        DirectionParams(20e-6, 0.01e-6, _GEN5_CURVE),
        DirectionParams(20e-6, 0.01e-6, _GEN5_CURVE),
        duplex_factor=0.8,
    ),
    "pcie4": TransferModelParams(
        "pcie4",
        DirectionParams(20e-6, 0.01e-6, _GEN4_CURVE),
        DirectionParams(20e-6, 0.01e-6, _GEN4_CURVE),
        duplex_factor=0.8,
    ),
    # Grace-Hopper NVLink-C2C: copy-engine H2D 342, D2H 295 GB/s (vLLM PR #6496).
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
