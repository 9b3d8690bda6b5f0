"""The simulator's link model from a calibration report (:func:`real.calibrate.fit`).

One place that knows both shapes: the report keeps rates as ``{"<page bytes>": GB/s}``
maps (JSON keys), the model as increasing ``(page_bytes, GB/s)`` pairs. The H2D direction
gets a ``kernel`` model only when the report has one, i.e. when loads were timed through
vLLM's Triton gather kernel; without it every simulated load is DMA, as every real one was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvsim.engine.transfer_model import Curve, DirectionParams, TransferModelParams

DEFAULT_DUPLEX_FACTOR = 0.8  # when the report has no "both" points to measure it


def _curve(gbps: Mapping[str, float]) -> Curve:
    return tuple(sorted((float(k), float(v)) for k, v in gbps.items()))


def _direction(report: Mapping[str, Any]) -> DirectionParams:
    from kvsim.engine.transfer_model import DirectionParams, KernelParams

    kernel = report.get("kernel")
    return DirectionParams(
        report["overhead_s"],
        report["per_copy_s"],
        _curve(report["curve_gbps"]),
        kernel=KernelParams(kernel["launch_s"], _curve(kernel["curve_gbps"])) if kernel else None,
    )


def to_profile(fitted: Mapping[str, Any], link: str) -> TransferModelParams:
    """:class:`TransferModelParams` named ``link`` from a :func:`real.calibrate.fit` result."""
    from kvsim.engine.transfer_model import TransferModelParams

    dirs = fitted["directions"]
    return TransferModelParams(
        link,
        _direction(dirs["h2d"]),
        _direction(dirs["d2h"]),
        fitted.get("duplex_factor", DEFAULT_DUPLEX_FACTOR),
    )
