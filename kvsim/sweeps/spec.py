"""The sweep spec (see :mod:`kvsim.sweeps` for an example): traces, a mode, fixed options and
a grid of option values, checked whole before any cell runs (names, types, ranges, a CPU
tier size), so a typo is one error, not a grid of failed cells. What each key takes is
described once, in :mod:`kvsim.sweeps.spec_schema`; this module reads a spec file and adds
the rules between keys.

A cell holds the values as the spec wrote them (``cpu_gib: 64`` stays an integer), so its id
and its row do not depend on how a check converts them; only a whole float is read as its int
everywhere (``max_num_seqs: 256.0``, a spreadsheet's transcription, is 256; ``1.0`` is the
cell ``1`` is), as a measurements file reads one.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec

from kvsim.core.errors import InputError
from kvsim.core.io import read_yaml
from kvsim.core.numeric import text_number_hint, whole_floats_as_ints
from kvsim.options.schema import Schema, load, short_repr
from kvsim.sweeps.cells import count_cells, expand
from kvsim.sweeps.inputs import trace_text
from kvsim.sweeps.spec_schema import (
    MODES,
    GeneratedTrace,
    option_type,
    other_mode_only,
    spec_struct,
)
from kvsim.sweeps.tier_sets import TIERS, canonical_tier_set, tier_set

#: how a spec given as a mapping (``kvsim.sweep({...})``) is named in an error
MAPPING_SOURCE = "sweep spec"
#: the ways to size the CPU tier; cache mode needs one, no mode takes two
_SIZES = ("cpu_chunks", "cpu_gib", "cpu_bytes")
_SECTIONS = ("options", "grid")
_GOT_TEXT = re.compile(r", got '(?P<text>[^'\\]*)'$")


@dataclass
class SweepSpec:
    """A validated sweep: the cells are the product of traces and the grid, in order."""

    traces: list[Any]
    mode: str = "cache"
    limit: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    name: str = "sweep"
    #: keep each cell's requests table in the output folder (:mod:`kvsim.sweeps.cell_tables`)
    keep_requests: bool = False

    @classmethod
    def load(cls, spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec) -> SweepSpec:
        """A spec from a YAML file, a mapping, or a :class:`SweepSpec` built by hand (checked
        too); any error is one line naming the file (or ``sweep spec``), the key and the
        value."""
        if isinstance(spec, SweepSpec):
            return cls.from_mapping(dataclasses.asdict(spec))
        if isinstance(spec, (str, os.PathLike)):
            path = os.fspath(spec)
            return cls.from_mapping(_read_yaml(path), source=path)
        return cls.from_mapping(spec)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = MAPPING_SOURCE) -> SweepSpec:
        """The spec checked whole: a bad key or value anywhere is one error naming it.

        Args:
            data: the spec's keys (see the module doc); not changed.
            source: what an error names first (the spec file's path).

        Returns:
            the spec, each trace and grid axis as a list, tier sets in their canonical form.
        """
        if not isinstance(data, Mapping):
            raise InputError(f"a sweep spec is a mapping, got {short_repr(data)}", source=source)
        data = whole_floats_as_ints(_plain(data))
        mode = data.get("mode", "cache")
        struct = spec_struct(mode if mode in MODES else "cache")
        _check_option_keys(data, str(mode), source)
        _load(struct, data, source)
        options = dict(data.get("options", {}))
        grid = {k: v if isinstance(v, list) else [v] for k, v in data.get("grid", {}).items()}
        traces = data["traces"] if isinstance(data["traces"], list) else [data["traces"]]
        for i, trace in enumerate(traces):
            if isinstance(trace, Mapping):
                _check_generator(trace, f"traces[{i}]", source)
        _check_rules(mode, options, grid, source)
        name = str(data.get("name", "sweep"))
        if "/" in name or os.sep in name or "\0" in name:  # the folder sweep-NAME, here
            raise InputError(
                f"name: a name, not a path (the default output folder is sweep-NAME), got {name!r}",
                source=source,
            )
        if TIERS in options:
            options[TIERS] = canonical_tier_set(options[TIERS])
        if TIERS in grid:
            grid[TIERS] = [canonical_tier_set(v) for v in grid[TIERS]]
        _check_repeats(traces, grid, source)
        return cls(
            traces=list(traces),
            mode=mode,
            limit=data.get("limit"),
            options=options,
            grid=grid,
            name=name,
            keep_requests=bool(data.get("keep_requests", False)),
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


def _check_repeats(traces: list[Any], grid: dict[str, list[Any]], source: str) -> None:
    """Refuse a spec that has the same cell twice: a repeated trace or grid value (``1``
    and ``1.0`` are one value, as are two spellings of one tier set), named with its file."""
    for name, values in [("traces", traces), *((f"grid.{k}", v) for k, v in grid.items())]:
        texts = [trace_text(v) for v in values]  # 1.0 was read as 1
        if len(set(texts)) != len(texts):
            repeated = next(v for v, t in zip(values, texts) if texts.count(t) > 1)
            raise InputError(
                f"the sweep has duplicate cells: {name} repeats {short_repr(repeated)}",
                source=source,
            )


def check_value(name: str, value: Any, where: str) -> None:
    """Raise a one-line :class:`InputError` naming ``where`` (``--cpu-gib``) unless ``value``
    suits option ``name``: checked before any cell runs, so ``cpu_gib: "64"`` never reaches
    arithmetic."""
    if name == TIERS:
        tier_set(value, where)
        return
    try:
        load(_one_option(name), {name: value}, source=None, names=lambda _: where)
    except InputError as e:
        raise InputError(_with_hint(str(e))) from None


@functools.cache
def _one_option(name: str) -> type[Schema]:
    fields = [(name, option_type(name))]
    return cast(type[Schema], msgspec.defstruct(f"Option_{name}", fields, bases=(Schema,)))


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with an empty section (``options:`` with nothing under it) left out, and
    paths given as ``os.PathLike`` as text and numpy values (a number, an array of grid
    values) as Python's, as a YAML file would give them."""

    def text(v: Any) -> Any:
        if isinstance(v, os.PathLike):
            return os.fspath(v)
        if type(v).__module__ == "numpy" and hasattr(v, "tolist"):
            return v.tolist()  # np.float64(16.0) -> 16.0, an array -> a list
        return v

    out = {
        k: v if k in (*_SECTIONS, "traces") else text(v)
        for k, v in data.items()
        if not (k in _SECTIONS and v is None)
    }
    if "traces" in out:
        traces = out["traces"]
        out["traces"] = (
            [text(t) for t in traces] if isinstance(traces, (list, tuple)) else text(traces)
        )
    for section in _SECTIONS:
        if isinstance(out.get(section), Mapping):
            values = {k: text(v) for k, v in out[section].items()}  # an array: a list
            out[section] = {
                k: [text(x) for x in v] if isinstance(v, (list, tuple)) else v
                for k, v in values.items()
            }
    return out


def _read_yaml(path: str) -> Any:
    return read_yaml(path, "sweep spec")


def _load(struct: type[Schema], data: Mapping[str, Any], source: str) -> None:
    """``data`` checked against ``struct`` (a number YAML read as text is named with the
    number to write)."""
    try:
        load(struct, data, source=source)
    except InputError as e:
        raise InputError(_with_hint(str(e))) from None


def _with_hint(message: str) -> str:
    """``message`` with a hint when its bad value is a number written as text (``'1e3'``
    quoted, or from the API)."""
    m = _GOT_TEXT.search(message)
    return message if m is None else message + text_number_hint(m.group("text"))


def _check_option_keys(data: Mapping[str, Any], mode: str, source: str) -> None:
    """Two keys that deserve more than 'unknown key': ``secondary_tiers`` (a sweep names
    tier sets ``tiers``) and an option of the other mode."""
    for section in _SECTIONS:
        keys = data.get(section)
        if not isinstance(keys, Mapping):
            continue  # the structure check names it
        for key in keys:
            where = f"{section}.{key}"
            if key == "secondary_tiers":
                raise InputError(
                    f"{where}: a sweep takes secondary tiers as {TIERS!r}, one tier set per "
                    "value (none, fs:capacity=2TiB+obj, or a list of vLLM tier objects)",
                    source=source,
                )
            if mode in MODES and key in other_mode_only(mode):
                other = "timed" if mode == "cache" else "cache"
                raise InputError(
                    f"{where}: an option of {other} mode, not of this {mode}-mode sweep, "
                    f"got {short_repr(keys[key])}",
                    source=source,
                )


def _check_generator(trace: Mapping[str, Any], where: str, source: str) -> None:
    """A generated trace's kind and knobs, checked by the generator itself (asked for no
    requests), so a typo fails here and not in every cell of the trace."""
    from kvsim.traces.synthetic import generate_from

    knobs = {k: v for k, v in trace.items() if k not in GeneratedTrace.__struct_fields__}
    try:
        generate_from(trace["kind"], 0, trace.get("seed", 0), knobs)
    except InputError as e:
        raise InputError(f"{where}: {e}", source=source) from None


def _check_rules(
    mode: str, options: dict[str, Any], grid: dict[str, list[Any]], source: str
) -> None:
    """The rules between keys: an option is fixed or swept, not both; one CPU tier size,
    and in cache mode at least one; each tier set readable."""
    clash = sorted(set(options) & set(grid))
    if clash:
        raise InputError(f"option(s) both fixed and swept: {', '.join(clash)}", source=source)
    given = set(options) | set(grid)
    if mode == "cache" and "vllm_config" not in given:
        for name in _SIZES:  # a null size is no size; cache mode needs one in every cell
            values = [options[name]] if name in options else grid.get(name, [])
            if None in values:
                where = f"options.{name}" if name in options else f"grid.{name}"
                raise InputError(
                    f"{where}: cache mode needs a CPU tier size in every cell, got null",
                    source=source,
                )
    sizes = [s for s in _SIZES if s in given]
    if len(sizes) > 1:
        raise InputError(f"give only one CPU tier size, got {' and '.join(sizes)}", source=source)
    if mode == "cache" and not sizes and "vllm_config" not in given:
        raise InputError(
            "no CPU tier size: cache mode needs cpu_chunks or cpu_gib (or vllm_config) "
            "in options or grid",
            source=source,
        )
    try:
        if TIERS in options:
            tier_set(options[TIERS], f"options.{TIERS}")
        for i, value in enumerate(grid.get(TIERS, [])):
            tier_set(value, f"grid.{TIERS}[{i}]")
        _check_names(options, grid)
        if mode == "timed":
            _check_engine(options, grid)
    except InputError as e:
        raise InputError(str(e), source=source) from None


def _check_names(options: dict[str, Any], grid: dict[str, list[Any]]) -> None:
    """Each policy, admission rule, model and GPU the cells name, looked up once as a run
    looks it up, so an unknown one is one error before any cell runs, not a grid of
    failed cells."""
    from kvsim.policies.registry import eviction_policy_class, make_admission
    from kvsim.specs.hardware import get_gpu
    from kvsim.specs.models import get_model

    module = options.get("policy_module")  # a swept module: each cell resolves its own
    lookups: dict[str, Any] = {
        "policy": lambda v: None if "policy_module" in grid else eviction_policy_class(v, module),
        "admission": make_admission,  # built as a run builds it: NAME:ARG too
        "model": get_model,
        "gpu": get_gpu,
    }
    for name, lookup in lookups.items():
        for where, value in _cell_values(options, grid, name):
            if not isinstance(value, str):
                continue  # the structure check names a value of the wrong type
            try:
                lookup(value)
            except InputError as e:
                raise InputError(f"{where}: {str(e).removeprefix(f'--{name}: ')}") from None


def _check_engine(options: dict[str, Any], grid: dict[str, list[Any]]) -> None:
    """Each engine a timed cell may start, against vLLM's startup rules (they are
    :mod:`kvsim.specs.context`'s, applied as a run applies them), so one vLLM would not
    start with is one error before any cell runs, not a failed cell."""
    from kvsim.specs.context import check_long_prefill_threshold

    lengths = _checked_lengths(options, grid)
    for (_, length), where in lengths.items():
        for at, threshold in _cell_values(options, grid, "long_prefill_token_threshold"):
            check_long_prefill_threshold(threshold, length, (at, where))
    _check_step_limits(options, grid, lengths)


def _checked_lengths(
    options: dict[str, Any], grid: dict[str, list[Any]]
) -> dict[tuple[int | None, int], str]:
    """Each distinct ``(given, resolved)`` ``max_model_len`` of a timed cell, with where the
    spec names it, each given one checked against each model it runs with."""
    from kvsim.options.offload import DEFAULT_MODEL
    from kvsim.specs.context import vllm_max_model_len
    from kvsim.specs.models import get_model

    lengths: dict[tuple[int | None, int], str] = {}
    models = [model for _, model in _cell_values(options, grid, "model")] or [None]
    given = _cell_values(options, grid, "max_model_len")
    for model in models:
        spec = get_model(model or DEFAULT_MODEL)  # a bad name: _check_names said so
        for where, value in given or [(f"{spec.name}'s max_model_len", None)]:
            length = vllm_max_model_len(spec, value, where)
            lengths.setdefault((value or None, length), where)
    return lengths


def _check_step_limits(
    options: dict[str, Any],
    grid: dict[str, list[Any]],
    lengths: dict[tuple[int | None, int], str],
) -> None:
    """Each step budget and request count a timed cell may start with, over the distinct
    values of the keys they depend on (GPU, length, chunked prefill, budget, count), not
    over the cells."""
    from kvsim.specs.context import vllm_step_limits
    from kvsim.specs.hardware import get_gpu

    gpus = [(f"{w} {v}", get_gpu(v)) for w, v in _or_timed_default(options, grid, "gpu")]
    chunked = _or_timed_default(options, grid, "enable_chunked_prefill")
    budgets = _cell_values(options, grid, "max_num_batched_tokens") or [("", None)]
    counts = _cell_values(options, grid, "max_num_seqs") or [("", None)]  # None: never refused
    axes = itertools.product(lengths.items(), chunked, gpus, budgets, counts)
    for ((given, length), at), (cw, chunks), (on, gpu), (bw, budget), (sw, count) in axes:
        if budget is None:  # vLLM's, which depends on the GPU
            bw = f"the default max_num_batched_tokens ({on})"
        step = functools.partial(vllm_step_limits, gpu, length, given is not None)
        _check_step(step, (cw, chunks), (budget, count), (bw, sw, at))


def _check_step(
    step: Callable[[bool, tuple[int | None, int | None], tuple[str, str, str]], object],
    chunked: tuple[str, bool],
    given: tuple[int | None, int | None],
    names: tuple[str, str, str],
) -> None:
    """``step`` (:func:`~kvsim.specs.context.vllm_step_limits`, for one GPU and length) with
    ``chunked`` (where, value); a refusal for want of chunked prefill (the same engine
    chunked starts) is led by that key, ``where false: ...``."""
    where, value = chunked
    try:
        step(value, given, names)
    except InputError as e:
        if value:
            raise
        try:
            step(True, given, names)
        except InputError:
            raise e from None
        raise InputError(f"{where} false: {e}") from None


def _or_timed_default(
    options: dict[str, Any], grid: dict[str, list[Any]], name: str
) -> list[tuple[str, Any]]:
    """:func:`_cell_values`, or the timed run's default for ``name``, named as such."""
    from kvsim.options.runs import SimulateOptions

    default = next(f.default for f in msgspec.structs.fields(SimulateOptions) if f.name == name)
    return _cell_values(options, grid, name) or [(f"the default {name}", default)]


def _cell_values(
    options: dict[str, Any], grid: dict[str, list[Any]], name: str
) -> list[tuple[str, Any]]:
    """``(where, value)`` for each value of option ``name`` the cells take: fixed
    (``options.NAME``) or swept (``grid.NAME[i]``); none when neither gives it."""
    if name in options:
        return [(f"options.{name}", options[name])]
    return [(f"grid.{name}[{i}]", v) for i, v in enumerate(grid.get(name, []))]
