"""The link JSON a user gives ``--link`` (written by ``kvsim calibrate``), described once:
:class:`LinkProfileFile` (a calibration profile) and :class:`ConstantLinkFile` (bytes /
rate, nothing else). Validation, bounds, help texts, "did you mean" and the JSON Schema
(``kvsim schema link-profile``, ``kvsim schema constant-link``) come from these classes;
:mod:`kvsim.engine.transfer_model` turns a checked file into the model it runs.

Numbers must be finite (:func:`kvsim.options.schema.not_finite`, the one home of that rule).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Literal

from msgspec import Meta

from kvsim.options.schema import Schema

__all__ = [
    "PROFILE_VERSION",
    "ConstantLinkFile",
    "DirectionFile",
    "KernelFile",
    "KeyedCurveFile",
    "LinkKind",
    "LinkProfileFile",
]

PROFILE_VERSION = 1

_Seconds = Annotated[float, Meta(ge=0)]
_Point = tuple[
    Annotated[float, Meta(gt=0, description="page bytes")],
    Annotated[float, Meta(gt=0, description="GB/s (1e9 bytes/s)")],
]
#: ``[[page_bytes, GB/s], ...]`` with increasing page sizes (checked by the owner's
#: ``__post_init__``, :func:`_increasing`)
Curve = Annotated[
    tuple[_Point, ...],
    Meta(
        min_length=1,
        description=(
            "[page_bytes, GB/s] points, page sizes increasing; linear between points, "
            "clamped at both ends."
        ),
    ),
]


def _increasing(curve: tuple[tuple[float, float], ...], what: str) -> None:
    sizes = [size for size, _ in curve]
    if any(b <= a for a, b in pairwise(sizes)):
        raise ValueError(f"{what}: page sizes must increase, got {sizes}")


class KernelFile(Schema, frozen=True, kw_only=True):
    """vLLM's Triton gather kernel for small CPU->GPU pages (loads only)."""

    launch_s: Annotated[_Seconds, Meta(description="Host time of one kernel launch, s.")]
    curve: Curve

    def __post_init__(self) -> None:
        _increasing(self.curve, "curve")


class KeyedCurveFile(Schema, frozen=True, kw_only=True):
    """The DMA rate curve measured at one descriptor count."""

    descriptors: Annotated[float, Meta(gt=0, description="Descriptors in the copy call.")]
    curve: Curve

    def __post_init__(self) -> None:
        _increasing(self.curve, "curve")


class DirectionFile(Schema, frozen=True, kw_only=True):
    """One copy direction: ``curve`` (any descriptor count) or ``curves`` (keyed by the
    descriptor count, increasing, interpolated in log N), and for loads optionally a
    ``kernel``."""

    overhead_s: Annotated[_Seconds, Meta(description="Per-job stream and event latency, s.")]
    per_copy_s: Annotated[
        _Seconds, Meta(description="Host time of one descriptor (driver call), s.")
    ]
    curve: Curve | None = None
    curves: (
        Annotated[
            tuple[KeyedCurveFile, ...],
            Meta(min_length=1, description="Rate curves by descriptor count, increasing."),
        ]
        | None
    ) = None
    kernel: (
        Annotated[KernelFile, Meta(description="The gather kernel's path (h2d only).")] | None
    ) = None

    def __post_init__(self) -> None:
        if (self.curve is None) == (self.curves is None):
            raise ValueError("give a direction either curve or curves")
        if self.curve is not None:
            _increasing(self.curve, "curve")
        counts = [c.descriptors for c in self.curves or ()]
        if any(b <= a for a, b in pairwise(counts)):
            raise ValueError(f"curves need increasing descriptor counts, got {counts}")


class LinkProfileFile(Schema, frozen=True, kw_only=True):
    """A calibration profile of one host link (``kvsim calibrate`` writes it)."""

    version: Annotated[Literal[1], Meta(description="The profile format's version (1).")]
    link: Annotated[str, Meta(description="A free-form name of the link.")] = "profile"
    h2d: Annotated[DirectionFile, Meta(description="Loads, CPU -> GPU.")]
    d2h: Annotated[DirectionFile, Meta(description="Stores, GPU -> CPU (DMA only).")]
    duplex_factor: Annotated[
        float,
        Meta(
            gt=0,
            le=1,
            description="Share of its one-way rate each direction keeps while both move bytes.",
        ),
    ] = 0.8

    def __post_init__(self) -> None:
        if self.d2h.kernel is not None:
            raise ValueError("d2h has no kernel (stores always use DMA)")


class ConstantLinkFile(Schema, frozen=True, kw_only=True):
    """The simplest link: each job takes bytes / rate, no overhead, no kernel, the two
    directions independent (to set a run beside another simulator's)."""

    kind: Literal["constant"]
    h2d_bytes_per_s: Annotated[float, Meta(gt=0, description="Load rate, bytes/s.")]
    d2h_bytes_per_s: Annotated[float, Meta(gt=0, description="Store rate, bytes/s.")]
    link: Annotated[str, Meta(description="A free-form name of the link.")] = "constant"


class LinkKind(Schema, frozen=True, forbid_unknown_fields=False):
    """Which of the two a link file is (its other keys are read by that one)."""

    kind: Annotated[
        Literal["profile", "constant"],
        Meta(description="constant: a ConstantLinkFile; absent: a calibration profile."),
    ] = "profile"
