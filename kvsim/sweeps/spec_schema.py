"""The sweep spec file described once, with :mod:`kvsim.options.schema`: its keys, the keys
of ``options`` and ``grid`` and what each value must be. From this description come the
checks (one line naming the key and the value, the closest key for a typo) and the JSON
Schema editors use (``kvsim schema sweep``).

An option's type, bounds and help text are not restated here: they are the fields of the
options the jobs take (:class:`~kvsim.options.offload.OffloadOptions`, and
:class:`~kvsim.options.runs.ReplayOptions` or :class:`~kvsim.options.runs.SimulateOptions`
by mode, and :class:`~kvsim.options.fleet.FleetOptions`: ``instances``, ``router`` ...).
A grid axis is a list of an option's values (a single value is an axis of one). ``tiers``
is the sweep's own axis of secondary-tier sets (:mod:`kvsim.sweeps.tier_sets` checks its
values); a generated trace's knobs are checked by :mod:`kvsim.traces.synthetic`.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, cast

import msgspec
from msgspec import UNSET, Meta, UnsetType

from kvsim.options.fleet import FleetOptions
from kvsim.options.offload import Count, OffloadOptions, Text
from kvsim.options.runs import ReplayOptions, SimulateOptions
from kvsim.options.schema import Schema
from kvsim.sweeps.tier_sets import TIERS

MODES = ("cache", "timed")
#: a cell's keys that are not ``replay`` / ``simulate`` keywords
CELL_KEYS = ("trace", "mode", "limit")
Mode = Literal["cache", "timed"]

#: job keywords a cell cannot set: the sweep sets them, they write files of their own, or
#: (``workload``, ``load``: a benchmark client instead of a trace) a cell's trace replaces them
NOT_OPTIONS = frozenset(
    {"limit", "per_request", "requests_csv", "secondary_tiers", "workload", "load"}
)

TierSetField = Annotated[
    Any,
    Meta(
        description=(
            "Secondary tiers behind the CPU tier, one tier set: 'none', tiers joined by '+' in "
            "kvsim replay --tier's shorthand (fs:capacity=1TiB+obj), or a list of vLLM tier "
            "objects."
        )
    ),
]


KeepRequests = Annotated[
    bool,
    Meta(
        description=(
            "Keep each cell's requests table, one row per request, as "
            "OUT/cells/CELL_ID/requests.parquet (CELL_ID: the results' cell_id column): what "
            "kvsim simulate writes for a timed cell, kvsim replay --requests-csv for a cache "
            "cell; kvsim plot OUT --kind ttft-cdf needs it. Needs an output folder."
        )
    ),
]


class GeneratedTrace(Schema, frozen=True, forbid_unknown_fields=False):
    """A generated workload as a trace (``kvsim.generate``); its other keys are the kind's
    knobs (``kvsim trace gen --help``), which the generator checks."""

    kind: Annotated[Text, Meta(description="Workload kind: chat, system-prompt, rag, agent, mix.")]
    n_requests: Annotated[Count, Meta(description="Requests to generate.")] = 1000
    seed: Annotated[int, Meta(description="Seed of the generator.")] = 0


@functools.cache
def option_types(mode: str) -> dict[str, Any]:
    """Option name -> what its value must be, for a cell of ``mode``: the fields of the
    offload options and of the mode's job options, and ``tiers``."""
    job = ReplayOptions if mode == "cache" else SimulateOptions
    fields = [
        *msgspec.structs.fields(OffloadOptions),
        *msgspec.structs.fields(job),
        *msgspec.structs.fields(FleetOptions),  # instances, router, shared tier (both modes)
    ]
    types = {f.encode_name: f.type for f in fields if f.encode_name not in NOT_OPTIONS}
    return {**types, TIERS: TierSetField}


def option_names(mode: str) -> frozenset[str]:
    """The options a cell of ``mode`` may set."""
    return frozenset(option_types(mode))


def option_type(name: str) -> Any:
    """What a value of option ``name`` must be, in whichever mode takes it."""
    return {**option_types("timed"), **option_types("cache")}[name]


def other_mode_only(mode: str) -> frozenset[str]:
    """Options that only the other mode takes (named as such in an error)."""
    other = "timed" if mode == "cache" else "cache"
    return option_names(other) - option_names(mode)


def _axis(t: Any) -> Any:
    """A grid axis of values of type ``t``: a non-empty list, or one value where that cannot
    be mistaken for a list."""
    values = Annotated[list[t], Meta(min_length=1)]
    try:
        msgspec.inspect.type_info(values | t)
    except TypeError:  # t is itself list-like: only a list is an axis
        return values
    return values | t


def _struct(name: str, types: dict[str, Any], doc: str) -> type[Schema]:
    fields = [(n, types[n] | UnsetType, UNSET) for n in sorted(types)]
    struct = cast(type[Schema], msgspec.defstruct(name, fields, bases=(Schema,), module=__name__))
    struct.__doc__ = doc
    return struct


def _spec_struct(types: dict[str, Any], title: str) -> type[Schema]:
    """The whole spec file's structure with ``options`` and ``grid`` taking ``types``."""
    options = _struct(
        f"{title}Options", types, "Options fixed in every cell (replay / simulate keywords)."
    )
    grid = _struct(
        f"{title}Grid",
        {n: _axis(t) for n, t in types.items()},
        "Options swept: each a list of values; every combination is one cell.",
    )
    trace = Text | GeneratedTrace
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        ("traces", Annotated[list[trace], Meta(min_length=1)] | trace),
        ("name", Text | int, "sweep"),
        ("mode", Mode, "cache"),
        ("limit", Count | None, None),
        ("keep_requests", KeepRequests, False),
        ("options", options, msgspec.field(default_factory=options)),
        ("grid", grid, msgspec.field(default_factory=grid)),
    ]
    struct = cast(type[Schema], msgspec.defstruct(title, fields, bases=(Schema,), module=__name__))
    struct.__doc__ = (
        "A kvsim sweep: every combination of traces and grid values is one run (cell), "
        "one row of the results table."
    )
    return struct


@functools.cache
def spec_struct(mode: str) -> type[Schema]:
    """The spec file's structure for a sweep in ``mode``: the other mode's options are
    unknown keys."""
    return _spec_struct(option_types(mode), f"{mode.capitalize()}SweepSpec")


#: the spec file for editors (``kvsim schema sweep``): ``options`` and ``grid`` take the
#: options of either mode
SweepSpecFile = _spec_struct({**option_types("timed"), **option_types("cache")}, "SweepSpec")
