"""The sweep spec file described once, with :mod:`kvsim.options.schema`: its keys, the keys
of ``options`` and ``grid`` (the keywords of ``replay`` or ``simulate``, by mode) and what
each value must be. From this description come the checks (one line naming the key and the
value, the closest key for a typo), and the JSON Schema editors use
(:func:`sweep_spec_json_schema`).

A grid axis is a list of an option's values (a single value is an axis of one). ``tiers`` is
the sweep's own axis of secondary-tier sets (:mod:`kvsim.sweeps.tier_sets` checks its
values); a generated trace is a mapping checked by :mod:`kvsim.traces.synthetic`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any, Literal, cast

import msgspec
from msgspec import UNSET, Meta, UnsetType

from kvsim.options.schema import Schema, json_schema
from kvsim.sweeps.tier_sets import TIERS

MODES = ("cache", "timed")
Mode = Literal["cache", "timed"]

#: API keywords a cell cannot set: the sweep sets them, or they write files of their own
NOT_OPTIONS = frozenset(
    {"trace", "limit", "per_request", "requests_csv", "progress", "secondary_tiers"}
)

# What each option's value must be. The options helper's schema for the run options
# (kvsim.options) replaces this table once it is on main: each rule then has one home.
Count = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[int, Meta(ge=0)]
Text = Annotated[str, Meta(min_length=1)]
Positive = Annotated[float, Meta(gt=0)]
Fraction = Annotated[float, Meta(gt=0, le=1)]
Texts = Text | list[Text]

_OPTION_TYPES: dict[str, Any] = {
    **dict.fromkeys(
        (
            "cpu_chunks",
            "cpu_bytes",
            "chunk_tokens",
            "block_tokens",
            "gpu_block_tokens",
            "tp",
            "max_tracker_size",
            "prefill_chunk_tokens",
            "max_num_batched_tokens",
            "max_num_seqs",
            "gpu_kv_blocks",
        ),
        Count,
    ),
    **dict.fromkeys(
        ("gpu_blocks", "store_threshold", "long_prefill_token_threshold", "sync_load_budget_bytes"),
        NonNegative,
    ),
    "seed": int,
    **dict.fromkeys(("cpu_gib", "time_scale", "poisson_rate"), Positive),
    "gpu_memory_utilization": Fraction,
    **dict.fromkeys(
        (
            "fused",
            "baseline",
            "enable_prefix_caching",
            "offload_prompt_only",
            "async_scheduling",
            "record_steps",
            "record_tokens",
        ),
        bool,
    ),
    **dict.fromkeys(
        (
            "model",
            "policy",
            "policy_module",
            "admission",
            "kv_cache_dtype",
            "protocol",
            "fmt",
            "gpu",
            "link",
            "compute_profile",
            "tier_load_rule",
        ),
        Text,
    ),
    "vllm_config": Text | dict[str, Any],
    "percentile_metrics": Texts,
    "metric_percentiles": Text | list[float],
    "goodput": Texts | dict[str, float],
    TIERS: Annotated[
        Any,
        Meta(
            description=(
                "Secondary tiers behind the CPU tier, one tier set: 'none', tiers joined by '+' "
                "in kvsim replay --tier's shorthand (fs:capacity=1TiB+obj), or a list of vLLM "
                "tier objects."
            )
        ),
    ],
}
#: a keyword of the API that the table above does not know yet: any single value
_ANY_SCALAR = bool | int | float | str


class GeneratedTrace(Schema, frozen=True):
    """A generated workload as a trace (``kvsim.generate``); its other keys are the kind's
    knobs (``kvsim trace gen --help``), which the generator checks."""

    kind: Annotated[Text, Meta(description="Workload kind: chat, system-prompt, rag, agent, mix.")]
    n_requests: Annotated[Count, Meta(description="Requests to generate.")] = 1000
    seed: Annotated[int, Meta(description="Seed of the generator.")] = 0


#: a generated trace's own keys (the rest are its kind's knobs)
GENERATOR_KEYS = frozenset(GeneratedTrace.__struct_fields__)


@functools.cache
def option_names(mode: str) -> frozenset[str]:
    """The keywords a cell of ``mode`` may set: the API function's own keywords, read from
    its signature so they stay in step, and ``tiers``."""
    from kvsim.api import replay, simulate

    fn = replay if mode == "cache" else simulate
    params = inspect.signature(fn).parameters.values()
    own = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return frozenset((own - NOT_OPTIONS) | {TIERS})


def option_type(name: str) -> Any:
    """What a value of option ``name`` must be (a type msgspec checks: bounds, help)."""
    return _OPTION_TYPES.get(name, _ANY_SCALAR)


def _axis(t: Any) -> Any:
    """A grid axis of values of type ``t``: a non-empty list, or one value where that cannot
    be mistaken for a list."""
    values = Annotated[list[t], Meta(min_length=1)]
    try:
        msgspec.inspect.type_info(values | t)
    except TypeError:  # t is itself list-like (or Any): only a list is an axis
        return values
    return values | t


def _struct(name: str, types: dict[str, Any], doc: str) -> type[Schema]:
    fields = [(n, types[n] | UnsetType, UNSET) for n in sorted(types)]
    struct = cast(type[Schema], msgspec.defstruct(name, fields, bases=(Schema,), module=__name__))
    struct.__doc__ = doc
    return struct


def _spec_struct(names: frozenset[str], title: str) -> type[Schema]:
    """The whole spec file's structure with ``options`` and ``grid`` keyed by ``names``."""
    types = {n: option_type(n) for n in names}
    options = _struct(
        f"{title}Options", types, "Options fixed in every cell (replay / simulate keywords)."
    )
    grid = _struct(
        f"{title}Grid",
        {n: _axis(t) for n, t in types.items()},
        "Options swept: each a list of values; every combination is one cell.",
    )
    traces = Annotated[list[Text | dict[str, Any]], Meta(min_length=1)] | Text | dict[str, Any]
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        ("traces", traces),
        ("name", Text | int, "sweep"),
        ("mode", Mode, "cache"),
        ("limit", Count | None, None),
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
    return _spec_struct(option_names(mode), f"{mode.capitalize()}SweepSpec")


def other_mode_only(mode: str) -> frozenset[str]:
    """Options that only the other mode takes (named as such in an error)."""
    other = "timed" if mode == "cache" else "cache"
    return option_names(other) - option_names(mode)


def sweep_spec_json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of a sweep spec, for editors: ``options`` and ``grid``
    take the keywords of either mode. A generated trace is an object with ``kind``
    (``kvsim trace gen --help`` lists kinds and knobs)."""
    schema = json_schema(_spec_struct(option_names("cache") | option_names("timed"), "SweepSpec"))
    generated = json_schema(GeneratedTrace)["$defs"]["GeneratedTrace"]
    generated = {**generated, "additionalProperties": True}  # the kind's knobs
    schema["$defs"]["GeneratedTrace"] = generated
    ref = {"$ref": "#/$defs/GeneratedTrace"}
    _replace_objects(schema["$defs"]["SweepSpec"]["properties"]["traces"], ref)
    return schema


def _replace_objects(node: dict[str, Any], ref: dict[str, str]) -> None:
    """Each bare ``{"type": "object"}`` under ``node`` (a trace given as a mapping) becomes
    ``ref``."""
    for key in ("anyOf", "items"):
        child = node.get(key)
        if isinstance(child, dict):
            _replace_objects(child, ref)
        elif isinstance(child, list):
            node[key] = [ref if c == {"type": "object"} else c for c in child]
            for c in node[key]:
                _replace_objects(c, ref)
