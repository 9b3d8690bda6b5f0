"""The sweep spec: traces, a mode, fixed options and a grid of option values, checked whole
before any cell runs (names, types, ranges, a CPU tier size), so a typo is one error, not a
grid of failed cells.

Spec (YAML or a mapping)::

    mode: cache                  # or timed
    traces: [traces/samples/mooncake_small.jsonl, {kind: chat, n_requests: 500, seed: 1}]
    limit: 200                   # optional, requests per trace
    options: {model: llama-3.1-8b}            # fixed for every cell
    grid: {policy: [lru, arc], cpu_chunks: [100, 400, 1600], store_threshold: [0, 2]}
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvsim.core.errors import InputError
from kvsim.sweeps.cells import STATUS_COLUMNS, count_cells, expand
from kvsim.sweeps.tier_sets import TIERS, canonical_tier_set, tier_set
from kvsim.sweeps.values import is_int, is_real, shown

MODES = ("cache", "timed")
SPEC_KEYS = {"name", "mode", "traces", "limit", "options", "grid"}

#: API keywords a cell cannot set: the sweep sets them, or they write files of their own
_NOT_OPTIONS = {"trace", "limit", "per_request", "requests_csv", "progress", "secondary_tiers"}
#: the ways to size the CPU tier; cache mode needs one, no mode takes two
_SIZES = ("cpu_chunks", "cpu_gib", "cpu_bytes")


@dataclass(frozen=True)
class _Kind:
    """What a value must be, in words for the error, and the test."""

    what: str
    ok: Callable[[Any], bool]


def _int_at_least(n: int) -> _Kind:
    return _Kind(f"an integer >= {n}", lambda v: is_int(v) and v >= n)


_POSITIVE = _Kind("a finite number > 0", lambda v: is_real(v) and v > 0)
_FRACTION = _Kind("a number in (0, 1]", lambda v: is_real(v) and 0 < v <= 1)
_BOOL = _Kind("true or false", lambda v: isinstance(v, bool))
_TEXT = _Kind("a name", lambda v: isinstance(v, str) and bool(v.strip()))
_TEXT_OR_MAP = _Kind("a path or a mapping", lambda v: isinstance(v, (str, Mapping)))
_SCALAR = _Kind("a single value", lambda v: isinstance(v, (bool, int, float, str)))

#: option -> what its value must be; names not listed (but known to the API) take any scalar
_KINDS: dict[str, _Kind] = {
    **{
        n: _int_at_least(1)
        for n in (
            "cpu_chunks",
            "chunk_tokens",
            "block_tokens",
            "gpu_block_tokens",
            "tp",
            "max_tracker_size",
            "prefill_chunk_tokens",
            "max_num_batched_tokens",
            "max_num_seqs",
            "gpu_kv_blocks",
            "cpu_bytes",
        )
    },
    **{
        n: _int_at_least(0)
        for n in (
            "gpu_blocks",
            "store_threshold",
            "seed",
            "long_prefill_token_threshold",
            "sync_load_budget_bytes",
        )
    },
    **{n: _POSITIVE for n in ("cpu_gib", "time_scale", "poisson_rate")},
    "gpu_memory_utilization": _FRACTION,
    **{
        n: _BOOL
        for n in (
            "fused",
            "baseline",
            "enable_prefix_caching",
            "offload_prompt_only",
            "record_steps",
        )
    },
    **{
        n: _TEXT
        for n in (
            "policy",
            "policy_module",
            "admission",
            "model",
            "kv_cache_dtype",
            "gpu",
            "link",
            "protocol",
            "fmt",
            "compute_profile",
        )
    },
    "vllm_config": _TEXT_OR_MAP,
}
_GENERATOR_KINDS = {"n_requests": _int_at_least(1), "seed": _int_at_least(0)}


def option_names(mode: str) -> frozenset[str]:
    """The keywords a cell of ``mode`` may set: the API function's own keywords and
    :class:`kvsim.options.offload.OffloadOptions` fields (read from the code, so they stay
    in step)."""
    from kvsim.api import replay, simulate
    from kvsim.options.offload import OffloadOptions

    fn = replay if mode == "cache" else simulate
    params = inspect.signature(fn).parameters.values()
    own = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    fields = {f.name for f in dataclasses.fields(OffloadOptions)}
    return frozenset(((own | fields) - _NOT_OPTIONS) | {TIERS})


def check_value(name: str, value: Any, where: str) -> None:
    """Raise a one-line :class:`InputError` naming ``where`` unless ``value`` suits option
    ``name``: checked before any cell runs, so ``cpu_gib: "64"`` never reaches arithmetic."""
    if name == TIERS:
        tier_set(value, where)
        return
    kind = _KINDS.get(name, _SCALAR)
    if not kind.ok(value):
        raise InputError(f"{where}: must be {kind.what}, got {shown(value)}")


def _check_names(names: Iterable[str], mode: str, where: str) -> None:
    """Every option is a keyword of the mode's API function (a typo is named, with a guess)."""
    known = option_names(mode)
    for name in names:
        if not isinstance(name, str):
            raise InputError(f"{where}: option names are text, got {shown(name)}")
        if name == "secondary_tiers":  # one way to give tiers, with a row label
            raise InputError(
                f"{where}.secondary_tiers: a sweep takes secondary tiers as {TIERS!r}, one tier "
                "set per value (none, fs:capacity=2TiB+obj, or a list of vLLM tier objects)"
            )
        if name not in known:
            guess = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {guess[0]!r}?" if guess else ""
            raise InputError(
                f"{where}.{name}: unknown option for {mode} mode{hint} "
                f"(known: {', '.join(sorted(known))})"
            )


def _mapping(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` as a dict (absent or null: empty); a list or a scalar is an error."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"{key}: must be a mapping of option: value, got {shown(value)}")
    return dict(value)


def _check_limit(limit: Any) -> int | None:
    if limit is None:
        return None
    if not (is_int(limit) and limit >= 1):
        raise InputError(f"limit: must be an integer >= 1 (requests per trace), got {shown(limit)}")
    return int(limit)


def _check_traces(traces: Any) -> list[Any]:
    """Paths or generator mappings; a generator's size and seed are checked here too."""
    if isinstance(traces, (str, os.PathLike, Mapping)):
        traces = [traces]
    if traces is None or (isinstance(traces, (list, tuple)) and not traces):
        raise InputError("a sweep needs at least one trace ('traces:')")
    if not isinstance(traces, (list, tuple)):
        raise InputError(f"traces: must be a list of paths or generators, got {shown(traces)}")
    for i, trace in enumerate(traces):
        where = f"traces[{i}]"
        if isinstance(trace, Mapping):
            _check_generator(trace, where)
        elif not isinstance(trace, (str, os.PathLike)) or not os.fspath(trace).strip():
            raise InputError(f"{where}: must be a path or a generator mapping, got {shown(trace)}")
    return list(traces)


def _check_generator(trace: Mapping[str, Any], where: str) -> None:
    from kvsim.traces.synthetic import WorkloadSpec

    for key, kind in _GENERATOR_KINDS.items():
        if key in trace and not kind.ok(trace[key]):
            raise InputError(f"{where}.{key}: must be {kind.what}, got {shown(trace[key])}")
    try:
        WorkloadSpec.from_mapping(trace)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def _check_grid(raw: dict[str, Any]) -> dict[str, list[Any]]:
    grid = {k: (list(v) if isinstance(v, (list, tuple)) else [v]) for k, v in raw.items()}
    for k, values in grid.items():
        if not values:
            raise InputError(f"grid.{k}: the axis is empty")
    return grid


def _check_options(mode: str, options: dict[str, Any], grid: dict[str, list[Any]]) -> None:
    """Names, clashes, every value, and the CPU tier size, before any cell runs."""
    clash = sorted(set(options) & set(grid))
    if clash:
        raise InputError(f"option(s) both fixed and swept: {', '.join(clash)}")
    reserved = sorted(
        (set(options) | set(grid)) & ({"trace", "mode", "limit"} | set(STATUS_COLUMNS))
    )
    if reserved:
        raise InputError(f"reserved name(s) in options/grid: {', '.join(reserved)}")
    _check_names(options, mode, "options")
    _check_names(grid, mode, "grid")
    for name, value in options.items():
        check_value(name, value, f"options.{name}")
    for name, values in grid.items():
        for i, value in enumerate(values):
            check_value(name, value, f"grid.{name}[{i}]")
    _check_size(mode, set(options) | set(grid))


def _check_size(mode: str, given: set[str]) -> None:
    sizes = [s for s in _SIZES if s in given]
    if len(sizes) > 1:
        raise InputError(f"give only one CPU tier size, got {' and '.join(sizes)}")
    if mode == "cache" and not sizes and "vllm_config" not in given:
        raise InputError(
            "no CPU tier size: cache mode needs cpu_chunks or cpu_gib (or vllm_config) "
            "in options or grid"
        )


@dataclass
class SweepSpec:
    """A validated sweep: the cells are the product of traces and the grid, in order."""

    traces: list[Any]
    mode: str = "cache"
    limit: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    name: str = "sweep"

    @classmethod
    def load(cls, spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec) -> SweepSpec:
        if isinstance(spec, SweepSpec):
            return cls.from_mapping(dataclasses.asdict(spec))  # built by hand: check it too
        if isinstance(spec, (str, os.PathLike)):
            import yaml

            try:
                with open(spec) as f:
                    data = yaml.safe_load(f)
            except FileNotFoundError:
                raise InputError("sweep spec not found", source=os.fspath(spec)) from None
            except yaml.YAMLError as e:
                where = getattr(e, "problem_mark", None)
                line = where.line + 1 if where is not None else None
                problem = getattr(e, "problem", None) or str(e).splitlines()[0]
                raise InputError(
                    f"bad YAML ({problem})", source=os.fspath(spec), line=line
                ) from None
            if not isinstance(data, dict):
                raise InputError("a sweep spec is a YAML mapping", source=os.fspath(spec))
            try:
                return cls.from_mapping(data)
            except InputError as e:
                raise InputError(str(e), source=os.fspath(spec)) from None
        return cls.from_mapping(spec)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SweepSpec:
        """The spec checked whole: a bad key or value anywhere is one error naming it."""
        if not isinstance(data, Mapping):
            raise InputError(f"a sweep spec is a mapping, got {shown(data)}")
        unknown = sorted(str(k) for k in set(data) - SPEC_KEYS)
        if unknown:
            guess = difflib.get_close_matches(unknown[0], sorted(SPEC_KEYS), n=1)
            raise InputError(
                f"unknown sweep spec key(s): {', '.join(unknown)}"
                f"{f' (did you mean {guess[0]!r}?)' if guess else ''}; "
                f"known: {', '.join(sorted(SPEC_KEYS))}"
            )
        traces = _check_traces(data.get("traces"))
        mode = data.get("mode", "cache")
        if not isinstance(mode, str) or mode not in MODES:
            raise InputError(f"mode must be one of {', '.join(MODES)}, got {shown(mode)}")
        grid = _check_grid(_mapping(data, "grid"))
        options = _mapping(data, "options")
        _check_options(mode, options, grid)
        if TIERS in options:
            options[TIERS] = canonical_tier_set(options[TIERS])
        if TIERS in grid:
            grid[TIERS] = [canonical_tier_set(v) for v in grid[TIERS]]
        name = data.get("name", "sweep")
        if not isinstance(name, (str, int)) or isinstance(name, bool):
            raise InputError(f"name: must be text, got {shown(name)}")
        return cls(
            traces=traces,
            mode=mode,
            limit=_check_limit(data.get("limit")),
            options=options,
            grid=grid,
            name=str(name),
        )

    @property
    def n_cells(self) -> int:
        """How many cells the sweep has, counted without building them."""
        return count_cells(self.traces, self.grid)

    def iter_cells(self) -> Iterator[dict[str, Any]]:
        """Every cell's configuration, built one at a time: traces outermost, grid axes in
        spec order (the last one fastest)."""
        return expand(self.traces, self.mode, self.limit, self.options, self.grid)

    def cells(self) -> list[dict[str, Any]]:
        """:meth:`iter_cells` as a list."""
        return list(self.iter_cells())
