"""A secondary tier's storage device as a user writes it (``kvsim_device`` naming a JSON
file) and as kvsim ships its presets (``kvsim/data/tier_devices.json``), described once:
:class:`DeviceFile`. Validation, bounds, help texts, "did you mean" and the JSON Schema
(``kvsim schema tier-device``) come from it; :mod:`kvsim.tiering.devices` turns a checked
file into the :class:`~kvsim.tiering.devices.DeviceSpec` its queue model runs.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, field

from kvsim.options.schema import Schema

__all__ = ["DeviceFile"]

_Rate = Annotated[float, Meta(gt=0)]
_Seconds = Annotated[float, Meta(ge=0)]
_Threads = Annotated[int, Meta(ge=1)]


class DeviceFile(Schema, frozen=True, kw_only=True):
    """One storage device as a tier sees it. Rates are bytes/s (null: unlimited); a
    direction's operations share its bandwidth equally, each capped by one thread's
    stream rate."""

    name: Annotated[str, Meta(description="The device's name (default: the file's path).")] | (
        None
    ) = None
    description: Annotated[str, Meta(description="What the device is.")] = ""
    read_bytes_per_s: Annotated[
        _Rate | None, Meta(description="Read bandwidth of the device, bytes/s (null: unlimited).")
    ]
    write_bytes_per_s: Annotated[
        _Rate | None, Meta(description="Write bandwidth of the device, bytes/s (null: unlimited).")
    ]
    stream_read_bytes_per_s: Annotated[
        _Rate | None, Meta(description="What one thread's read stream gets, bytes/s.")
    ]
    stream_write_bytes_per_s: Annotated[
        _Rate | None, Meta(description="What one thread's write stream gets, bytes/s.")
    ]
    read_latency_s: Annotated[
        _Seconds, Meta(description="Fixed cost of one read operation (open, request), s.")
    ]
    write_latency_s: Annotated[
        _Seconds, Meta(description="Fixed cost of one write operation (create, rename), s.")
    ]
    lookup_latency_s: Annotated[
        _Seconds, Meta(description="Time from a batch of existence checks to its answer, s.")
    ]
    n_read_threads: Annotated[
        _Threads, Meta(description="Threads that read (vLLM's fs n_read_threads).")
    ]
    n_write_threads: Annotated[
        _Threads, Meta(description="Threads that write (vLLM's fs n_write_threads).")
    ]
    source: Annotated[
        dict[str, str], Meta(description="Where each figure comes from, by its key.")
    ] = field(default_factory=dict)
