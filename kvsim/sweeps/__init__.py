"""Sweeps: traces x options grid -> one tidy table, one row per cell.

A *cell* is a plain dict (``trace``, ``mode``, ``limit`` and option fields); :func:`run_cell`
is a pure function of it and of the trace's content, so a row is the same on a process pool,
on Ray, or run alone (``elapsed_s`` aside). The whole spec is checked before any cell runs
(names, types, ranges, a CPU tier size), so a typo is one error, not a grid of failed cells.

With an output folder (locked: one sweep at a time) each finished row is appended to
``journal.jsonl`` and flushed at once; ``results.parquet`` and ``results.csv`` are rewritten
atomically from the journal. Re-running the same sweep into the same folder skips every cell
whose ``cell_id`` (a hash of its configuration) is already journaled with the same
``run_key`` (the trace's content fingerprint and kvsim's version); a regenerated trace or a
new kvsim runs the cell again.

Spec (YAML or a mapping)::

    mode: cache                  # or timed
    traces: [traces/samples/mooncake_small.jsonl, {kind: chat, n_requests: 500, seed: 1}]
    limit: 200                   # optional, requests per trace
    options: {model: llama-3.1-8b}            # fixed for every cell
    grid: {policy: [lru, arc], cpu_chunks: [100, 400, 1600], store_threshold: [0, 2]}

``tiers`` sweeps the secondary tiers behind the CPU tier (vLLM's ``secondary_tiers``): each
value is one tier *set*, the text ``none`` or tiers joined by ``+`` in ``kvsim replay
--tier``'s shorthand (``fs:capacity=1TiB+obj``), or a list of vLLM tier objects. Rows get a
``tiers`` label and the hit share of each tier (:func:`tier_shares`)::

    grid: {cpu_gib: [16, 64, 256], tiers: [none, "fs:capacity=256GiB", "fs:capacity=2TiB"]}
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import difflib
import hashlib
import inspect
import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import traceback
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvsim.core.errors import InputError
from kvsim.core.io import atomic_path
from kvsim.options.tiers import as_tier_specs, tier_from_shorthand, tier_to_shorthand
from kvsim.report.progress import Progress, ProgressArg
from kvsim.report.result import kvsim_version, write_metadata

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

MODES = ("cache", "timed")
EXECUTORS = ("local", "serial", "ray")
JOURNAL = "journal.jsonl"
LOCK = ".sweep.lock"
SPEC_KEYS = {"name", "mode", "traces", "limit", "options", "grid"}
STATUS_COLUMNS = ("cell", "cell_id", "status", "error", "elapsed_s")
#: a cell whose worker process dies this many times is recorded as failed (fewer: re-run)
CRASH_LIMIT = 2

Warn = Callable[[str], None]

# --------------------------------------------------------------------------- spec checks

#: API keywords a cell cannot set: the sweep sets them, or they write files of their own
_NOT_OPTIONS = {"trace", "limit", "per_request", "requests_csv", "progress", "secondary_tiers"}
#: the sweep's axis of secondary-tier sets: a cell's ``secondary_tiers``, with a row label
TIERS = "tiers"
#: the ways to size the CPU tier; cache mode needs one, no mode takes two
_SIZES = ("cpu_chunks", "cpu_gib", "cpu_bytes")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class _Kind:
    """What a value must be, in words for the error, and the test."""

    what: str
    ok: Callable[[Any], bool]


def _int_at_least(n: int) -> _Kind:
    return _Kind(f"an integer >= {n}", lambda v: _is_int(v) and v >= n)


_POSITIVE = _Kind("a finite number > 0", lambda v: _is_real(v) and v > 0)
_FRACTION = _Kind("a number in (0, 1]", lambda v: _is_real(v) and 0 < v <= 1)
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
    from kvsim.options.offload import OFFLOAD_FIELDS

    fn = replay if mode == "cache" else simulate
    params = inspect.signature(fn).parameters.values()
    own = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    fields = set(OFFLOAD_FIELDS)
    return frozenset(((own | fields) - _NOT_OPTIONS) | {TIERS})


def _shown(v: Any) -> str:
    """A bad value as the user wrote it; numbers YAML read as text get a hint."""
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return f"a list ({v!r})"
    if isinstance(v, Mapping):
        return f"a mapping ({dict(v)!r})"
    if isinstance(v, str):
        try:
            x = float(v)
        except ValueError:
            return repr(v)
        if not math.isfinite(x):
            return f"the text {v!r}"
        plain = str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)
        return f"the text {v!r} (write a plain number such as {plain})"
    return repr(v)


def check_value(name: str, value: Any, where: str) -> None:
    """Raise a one-line :class:`InputError` naming ``where`` unless ``value`` suits option
    ``name``: checked before any cell runs, so ``cpu_gib: "64"`` never reaches arithmetic."""
    if name == TIERS:
        tier_set(value, where)
        return
    kind = _KINDS.get(name, _SCALAR)
    if not kind.ok(value):
        raise InputError(f"{where}: must be {kind.what}, got {_shown(value)}")


def _check_names(names: Iterable[str], mode: str, where: str) -> None:
    """Every option is a keyword of the mode's API function (a typo is named, with a guess)."""
    known = option_names(mode)
    for name in names:
        if not isinstance(name, str):
            raise InputError(f"{where}: option names are text, got {_shown(name)}")
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
        raise InputError(f"{key}: must be a mapping of option: value, got {_shown(value)}")
    return dict(value)


def _check_limit(limit: Any) -> int | None:
    if limit is None:
        return None
    if not (_is_int(limit) and limit >= 1):
        raise InputError(
            f"limit: must be an integer >= 1 (requests per trace), got {_shown(limit)}"
        )
    return int(limit)


def _check_traces(traces: Any) -> list[Any]:
    """Paths or generator mappings; a generator's size and seed are checked here too."""
    if isinstance(traces, (str, os.PathLike, Mapping)):
        traces = [traces]
    if traces is None or (isinstance(traces, (list, tuple)) and not traces):
        raise InputError("a sweep needs at least one trace ('traces:')")
    if not isinstance(traces, (list, tuple)):
        raise InputError(f"traces: must be a list of paths or generators, got {_shown(traces)}")
    for i, trace in enumerate(traces):
        where = f"traces[{i}]"
        if isinstance(trace, Mapping):
            _check_generator(trace, where)
        elif not isinstance(trace, (str, os.PathLike)) or not os.fspath(trace).strip():
            raise InputError(f"{where}: must be a path or a generator mapping, got {_shown(trace)}")
    return list(traces)


def _check_generator(trace: Mapping[str, Any], where: str) -> None:
    from kvsim.traces.synthetic import WorkloadSpec

    for key, kind in _GENERATOR_KINDS.items():
        if key in trace and not kind.ok(trace[key]):
            raise InputError(f"{where}.{key}: must be {kind.what}, got {_shown(trace[key])}")
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


# --------------------------------------------------------------------------- tier sets

#: joins the tiers of one set in its text form (``fs:capacity=1TiB+obj``)
TIER_JOIN = "+"
#: the tier set without secondary tiers
NO_TIERS = "none"
#: a ``+`` that starts the next tier (a name, then ``:``, ``+`` or the end); one inside a
#: value (``capacity=1.5e+12``) does not
_NEXT_TIER = re.compile(r"\+(?=\s*[A-Za-z_][\w-]*\s*(?::|\+|$))")
#: a secondary tier's hit share in a replay summary (``tier1_fs_hit_ratio``) and in a timed
#: run's (``tier1_fs_hit_share``, of the prompt tokens)
_TIER_HIT = re.compile(r"tier\d+_\w+_hit_ratio")
_TIER_SHARE = re.compile(r"tier\d+_\w+_hit_share")


def tier_set(value: Any, where: str = TIERS) -> list[dict[str, Any]]:
    """One tier set as vLLM ``secondary_tiers`` objects, each checked (an error names
    ``where``): ``none`` or an empty list is no tiers; text is tiers joined by ``+``, each in
    ``kvsim replay --tier``'s shorthand; a list holds shorthand texts or vLLM tier objects
    (one object alone is a set of one)."""
    if isinstance(value, Mapping):
        value = [value]
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == NO_TIERS:
            return []
        if not text:
            raise InputError(f"{where}: empty tier set; write {NO_TIERS!r} for no secondary tiers")
        items: list[Any] = _NEXT_TIER.split(text)
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise InputError(
            f"{where}: a tier set is text such as 'fs:capacity=2TiB+obj' or {NO_TIERS!r}, "
            f"or a list of tier objects; got {_shown(value)}"
        )
    tiers = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            try:
                as_tier_specs([dict(item)], where)
            except InputError as e:  # named by its place in the set, not in a list of one
                raise InputError(str(e).replace(f"{where}[0]", f"{where}[{i}]", 1)) from None
            tiers.append(dict(item))
        elif isinstance(item, str) and item.strip().lower() == NO_TIERS:
            raise InputError(f"{where}: {NO_TIERS!r} is a tier set of its own, not a tier")
        elif isinstance(item, str) and item.strip():
            tiers.append(tier_from_shorthand(item.strip(), f"{where}: {item.strip()!r}"))
        else:
            raise InputError(
                f"{where}: each tier is TYPE[:KEY=VALUE,...] (tiers joined by "
                f"{TIER_JOIN!r}) or a tier object; got {_shown(item)}"
            )
    return tiers


def tier_set_label(value: Any) -> str:
    """A tier set as one line of text: ``none``, or its tiers in the shorthand joined by
    ``+`` (a value the shorthand has no form for, such as a ``backpressure`` object, as
    JSON)."""
    return TIER_JOIN.join(tier_to_shorthand(t) for t in tier_set(value)) or NO_TIERS


def _canonical_tier_set(value: Any) -> str | list[dict[str, Any]]:
    """A tier set as its cells hold it: its label when that reads back as the same tiers
    (``fs: capacity=1TiB`` and ``[{type: fs, kvsim_capacity: 1TiB}]`` are one cell), else
    its tier objects."""
    tiers = tier_set(value)
    label = tier_set_label(tiers)
    try:
        same = tier_set(label) == tiers
    except InputError:
        same = False
    return label if same else tiers


def _secondary_tiers(value: Any, has_vllm_config: bool) -> dict[str, Any]:
    """The API keyword a cell's tier set becomes. ``none`` passes nothing, so its row is the
    plain run's, unless a ``vllm_config`` is there, whose tiers it then clears."""
    tiers = tier_set(value)
    return {"secondary_tiers": tiers} if tiers or has_vllm_config else {}


def tier_shares(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What a tier-set row adds to its run's summary, so every row of the sweep has the same
    shares: ``cpu_tier_hit_ratio`` (in a run without secondary tiers, all its CPU hits) and
    ``secondary_tier_hit_ratio``, the share of prompt blocks promoted from any secondary
    tier (the sum of the ``tierN_TYPE_hit_ratio`` columns; 0 without tiers); for a timed
    run, ``combined_hit_share`` (GPU and CPU hit tokens over prompt tokens, the timed
    counterpart of ``combined_hit_ratio``) and ``secondary_tier_hit_share``, the sum of its
    ``tierN_TYPE_hit_share`` (0 without tiers)."""
    out: dict[str, Any] = {}
    if "cpu_tier_hit_ratio" not in summary and "cpu_hit_ratio" in summary:
        out["cpu_tier_hit_ratio"] = summary["cpu_hit_ratio"]
        if "cpu_hit_blocks" in summary:
            out["cpu_tier_hit_blocks"] = summary["cpu_hit_blocks"]
    if "cpu_tier_hit_ratio" in summary or out:
        out["secondary_tier_hit_ratio"] = float(
            sum(v for k, v in summary.items() if _TIER_HIT.fullmatch(k) and _is_real(v))
        )
    prompt = summary.get("total_input_tokens")
    if _is_real(prompt) and "cpu_hit_tokens" in summary:  # a timed run
        hits = summary.get("gpu_hit_tokens", 0) + summary.get("cpu_hit_tokens", 0)
        out["combined_hit_share"] = hits / prompt if prompt else 0.0
        out["secondary_tier_hit_share"] = float(
            sum(v for k, v in summary.items() if _TIER_SHARE.fullmatch(k) and _is_real(v))
        )
    return out


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
            raise InputError(f"a sweep spec is a mapping, got {_shown(data)}")
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
            raise InputError(f"mode must be one of {', '.join(MODES)}, got {_shown(mode)}")
        grid = _check_grid(_mapping(data, "grid"))
        options = _mapping(data, "options")
        _check_options(mode, options, grid)
        if TIERS in options:
            options[TIERS] = _canonical_tier_set(options[TIERS])
        if TIERS in grid:
            grid[TIERS] = [_canonical_tier_set(v) for v in grid[TIERS]]
        name = data.get("name", "sweep")
        if not isinstance(name, (str, int)) or isinstance(name, bool):
            raise InputError(f"name: must be text, got {_shown(name)}")
        return cls(
            traces=traces,
            mode=mode,
            limit=_check_limit(data.get("limit")),
            options=options,
            grid=grid,
            name=str(name),
        )

    def cells(self) -> list[dict[str, Any]]:
        """Every cell's configuration, traces outermost, grid axes in spec order."""
        axes = list(self.grid)
        out = []
        for trace in self.traces:
            for values in itertools.product(*(self.grid[a] for a in axes)):
                cell = {
                    "trace": trace,
                    "mode": self.mode,
                    "limit": self.limit,
                    **self.options,
                    **dict(zip(axes, values)),
                }
                out.append(cell)
        return out


def cell_id(cell: Mapping[str, Any]) -> str:
    """A stable hash of a cell's configuration (what resume matches on, with the run key)."""
    text = json.dumps(cell, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- run keys

#: bytes hashed at each end of a trace file: enough to tell a regenerated trace apart
_FINGERPRINT_BYTES = 1 << 20


def trace_fingerprint(trace: Any, base_dir: str | None = None) -> str:
    """What a trace's rows depend on beyond its path: size, mtime and a hash of the first and
    last MiB (a regenerated file differs in one of them), without reading a large file whole.

    A generator's output is fixed by its mapping (part of the cell); a missing file's key
    changes once it exists; a FIFO or device cannot be fingerprinted, so it never matches."""
    if isinstance(trace, Mapping):
        return "generated"
    path = _resolve_trace(trace, base_dir)
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    if not os.path.isfile(path):
        return f"unfingerprintable:{time.time_ns()}"
    h = hashlib.sha1(f"{st.st_size}:{st.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        h.update(f.read(_FINGERPRINT_BYTES))
        if st.st_size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, st.st_size - _FINGERPRINT_BYTES))
            h.update(f.read(_FINGERPRINT_BYTES))
    return h.hexdigest()


def run_key(trace: Any, base_dir: str | None = None, version: str | None = None) -> str:
    """A journaled row is reused only under the same key: same trace content, same kvsim."""
    text = f"{version or kvsim_version()}\0{trace_fingerprint(trace, base_dir)}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _run_keys(cells: list[dict[str, Any]], ids: list[str], base_dir: str) -> dict[str, str]:
    """cell_id -> run key, each trace fingerprinted once."""
    version = kvsim_version()
    by_trace: dict[str, str] = {}
    keys = {}
    for cell, cid in zip(cells, ids):
        label = json.dumps(cell["trace"], sort_keys=True, default=str)
        if label not in by_trace:
            by_trace[label] = run_key(cell["trace"], base_dir, version)
        keys[cid] = by_trace[label]
    return keys


# --------------------------------------------------------------------------- one cell


def _trace_label(trace: Any) -> str:
    if isinstance(trace, Mapping):
        from kvsim.traces.synthetic import WorkloadSpec

        return WorkloadSpec.from_mapping(trace).label()
    return str(trace)


#: the last generated trace (its mapping as JSON -> requests): cells that share a generator
#: in one process generate it once
_generated: dict[str, Any] = {}


def _resolve_trace(trace: Any, base_dir: str | None) -> Any:
    if isinstance(trace, Mapping):
        from kvsim.traces.synthetic import WorkloadSpec

        label = json.dumps(trace, sort_keys=True, default=str)
        if label not in _generated:
            _generated.clear()
            _generated[label] = WorkloadSpec.from_mapping(trace).requests()
        return _generated[label]
    path = os.fspath(trace)
    if base_dir and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    return path


def _metrics(
    mode: str,
    trace: Any,
    limit: int | None,
    options: dict[str, Any],
    baseline_key: Callable[[], str],
) -> dict[str, Any]:
    if mode == "cache":
        from kvsim.api import replay

        return dict(replay(trace, limit=limit, per_request=False, **options).summary)
    try:
        from kvsim.api import BASELINE_PREFIX, simulate
    except ImportError as e:
        raise RuntimeError(f"timed mode is not available in this kvsim build ({e})") from None
    folder = os.environ.get(_BASELINES_ENV)
    if not options.get("baseline") or folder is None or not _can_lock():
        return dict(simulate(trace, limit=limit, **options).summary)
    # the first cell of a (trace, engine configuration) runs the baseline; the others wait
    # for it and run only their own offloading run
    path = os.path.join(folder, f"{baseline_key()}.json")
    with _locked(path + ".lock"):
        shared = _read_baseline(path)
        if shared is None:
            summary = dict(simulate(trace, limit=limit, **options).summary)
            base = {k: v for k, v in summary.items() if k.startswith(BASELINE_PREFIX)}
            with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
                json.dump(base, f, default=_json_default, allow_nan=True)
            return summary
    summary = dict(simulate(trace, limit=limit, **{**options, "baseline": False}).summary)
    summary.update(shared)
    return summary


# --------------------------------------------------------------------------- shared baselines

#: names the folder a sweep's processes share while it runs: one offload-free baseline per
#: (trace, engine configuration), run by the first timed cell that needs it
_BASELINES_ENV = "KVSIM_SWEEP_BASELINES"
#: options that shape only the CPU tier, which a run without offloading never reads
_CPU_TIER_OPTIONS = frozenset(
    {
        TIERS,  # secondary tiers sit behind the CPU tier: no offloading, no tiers
        "cpu_chunks",
        "cpu_gib",
        "cpu_bytes",
        "policy",
        "policy_module",
        "admission",
        "store_threshold",
        "max_tracker_size",
    }
)


@contextlib.contextmanager
def _shared_baselines() -> Iterator[None]:
    """A folder for this sweep's baselines, named in the environment so that every worker
    it starts on this machine finds it; removed afterwards."""
    import tempfile

    saved = os.environ.get(_BASELINES_ENV)
    with tempfile.TemporaryDirectory(prefix="kvsim-sweep-baselines-") as folder:
        os.environ[_BASELINES_ENV] = folder
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(_BASELINES_ENV, None)
            else:
                os.environ[_BASELINES_ENV] = saved


def _sharing_baselines(
    cells: list[dict[str, Any]], rows: Iterator[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """The executor's rows, its cells run with a shared baselines folder (when a timed
    cell runs a baseline)."""
    if not any(c.get("mode") == "timed" and c.get("baseline") for c in cells):
        yield from rows
        return
    with _shared_baselines():
        yield from rows


def _baseline_key(cell: Mapping[str, Any], base_dir: str | None) -> str:
    """What a timed run without offloading depends on: the trace (and its content), the
    limit, and every option but the CPU tier's."""
    engine = {k: v for k, v in cell.items() if k not in _CPU_TIER_OPTIONS}
    engine["fingerprint"] = trace_fingerprint(cell["trace"], base_dir)
    text = json.dumps(engine, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def _can_lock() -> bool:
    try:
        import fcntl  # noqa: F401
    except ImportError:  # no flock (Windows): each cell runs its own baseline
        return False
    return True


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (waiting for it); released when this process
    ends, however it ends."""
    import fcntl

    with open(path, "a+", encoding="utf-8") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _read_baseline(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_cell(cell: Mapping[str, Any], base_dir: str | None = None) -> dict[str, Any]:
    """Run one cell; never raises: a failure becomes ``status="error"`` with its message.

    Relative trace paths are read from ``base_dir`` (the driver's working directory), which is
    not part of the configuration.
    """
    start = time.perf_counter()
    cell = dict(cell)
    row = _config_row(cell)
    options = {k: v for k, v in cell.items() if k not in ("trace", "mode", "limit", TIERS)}
    try:
        if TIERS in cell:
            options.update(_secondary_tiers(cell[TIERS], "vllm_config" in options))
        metrics = _metrics(
            cell.get("mode", "cache"),
            _resolve_trace(cell["trace"], base_dir),
            cell.get("limit"),
            options,
            lambda: _baseline_key(cell, base_dir),
        )
        metrics.pop("trace", None)
        if TIERS in cell:
            metrics.update(tier_shares(metrics))
        for k, v in metrics.items():
            if k not in row and _scalar(v):
                row[k] = v
        row.update(status="ok", error=None)
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" [{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        row.update(status="error", error=f"{type(e).__name__}: {e}{where}")
    row["elapsed_s"] = time.perf_counter() - start
    return row


def _failed_row(cell: Mapping[str, Any], error: str) -> dict[str, Any]:
    """The row of a cell that did not finish in its worker (the cell function never raises)."""
    return {
        **_config_row(cell),
        "status": "error",
        "error": f"worker failed: {error}",
        "elapsed_s": math.nan,
    }


def _config_row(cell: Mapping[str, Any]) -> dict[str, Any]:
    """A row's configuration columns: the cell, with readable labels for the trace and the
    tier set."""
    row = {"cell_id": cell_id(cell), **cell, "trace": _trace_label(cell["trace"])}
    if TIERS in cell:
        row[TIERS] = tier_set_label(cell[TIERS])
    return row


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


# --------------------------------------------------------------------------- executors


def _run_serial(
    cells: list[dict[str, Any]], base_dir: str, workers: int, address: str | None
) -> Iterator[dict[str, Any]]:
    for c in cells:
        yield run_cell(c, base_dir)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: how often a worker checks that the sweep's main process is still its parent
_PARENT_POLL_S = 0.5


def _exit_with_parent(parent_pid: int | None) -> None:
    """Make this worker die with the sweep's main process (a killed driver must not leave
    workers blocked forever): Linux's parent-death signal, and everywhere a watchdog thread
    that exits when the parent changes (also covers a parent that died before this ran).

    Linux sends the signal when the *thread* that started the worker ends; the sweep starts
    every worker from the thread that called it, which waits for them."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    parent = parent_pid or os.getppid()
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="kvsim-sweep-parent-watch", daemon=True).start()


def _worker_main(conn: Connection, base_dir: str, parent_pid: int | None) -> None:
    """A pool worker: cells in, rows out, one at a time, until told to stop (``None``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler, inherited by fork
    _exit_with_parent(parent_pid)
    while True:
        try:
            cell = conn.recv()
        except (EOFError, OSError):
            return
        if cell is None:
            return
        row = run_cell(cell, base_dir)
        try:
            conn.send(row)
        except OSError:  # the driver is gone
            return


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    cell: dict[str, Any] | None = None  # the cell it is running


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


class _Pool:
    """Worker processes that each run one cell at a time, so a worker's death (an OOM kill)
    is charged to exactly the cell it was running, and to no other.

    ``ProcessPoolExecutor`` fails every pending cell when one worker dies; here the dead
    worker is replaced and only its cell is queued again; after :data:`CRASH_LIMIT` deaths
    that cell is recorded as failed and the rest of the sweep goes on."""

    def __init__(self, size: int, base_dir: str):
        self.ctx = multiprocessing.get_context()
        self.size = size
        self.base_dir = base_dir
        self.running: list[_Worker] = []
        self.idle: list[_Worker] = []
        self.crashes: Counter[str] = Counter()
        # fork and spawn make this process the parent; forkserver's parent is the server
        forked = self.ctx.get_start_method() in ("fork", "spawn")
        self.parent_pid = os.getpid() if forked else None

    def run(self, cells: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        queue = deque(cells)
        while queue or self.running:
            while queue and len(self.running) < self.size:
                self._hand(self.idle.pop() if self.idle else self._spawn(), queue.popleft())
            for worker in self._ready():
                yield from self._collect(worker, queue)
        self._stop_idle()

    def _spawn(self) -> _Worker:
        ours, theirs = self.ctx.Pipe()
        process = self.ctx.Process(
            target=_worker_main,
            args=(theirs, self.base_dir, self.parent_pid),
            name="kvsim-sweep-worker",
            daemon=True,
        )
        process.start()
        theirs.close()
        return _Worker(process, ours)

    def _hand(self, worker: _Worker, cell: dict[str, Any]) -> None:
        worker.cell = cell
        self.running.append(worker)
        with contextlib.suppress(OSError):  # died idle: its sentinel reports it next
            worker.conn.send(cell)

    def _ready(self) -> list[_Worker]:
        """Running workers with a row to read or a death to report."""
        by_handle: dict[Any, _Worker] = {}
        for w in self.running:
            by_handle[w.conn] = w
            by_handle[w.process.sentinel] = w
        ready = wait(list(by_handle))
        return list({id(by_handle[h]): by_handle[h] for h in ready}.values())

    def _collect(self, worker: _Worker, queue: deque[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        self.running.remove(worker)
        cell, worker.cell = worker.cell, None
        assert cell is not None
        row = self._receive(worker)
        if row is not None:
            if worker.process.is_alive():
                self.idle.append(worker)
            else:
                self._discard(worker)
            yield row
            return
        self._discard(worker)
        cid = cell_id(cell)
        self.crashes[cid] += 1
        if self.crashes[cid] < CRASH_LIMIT:
            queue.append(cell)  # not this cell's fault yet: run it again, last
            return
        how = _death(worker.process.exitcode)
        yield _failed_row(
            cell, f"the process running this cell died ({how}), {self.crashes[cid]} times"
        )

    @staticmethod
    def _receive(worker: _Worker) -> dict[str, Any] | None:
        """The worker's row, or None when it died without one."""
        try:
            if worker.conn.poll():
                row: dict[str, Any] = worker.conn.recv()
                return row
        except Exception:  # EOF, or a message cut short by the death
            return None
        return None

    @staticmethod
    def _discard(worker: _Worker, timeout: float = 5.0) -> None:
        worker.process.join(timeout)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.conn.close()

    def _stop_idle(self) -> None:
        for worker in self.idle:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in self.idle:
            self._discard(worker)
        self.idle.clear()

    def close(self) -> None:
        """Interrupted (or done): stop every worker at once; queued cells stay not run."""
        for worker in self.running + self.idle:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in self.running + self.idle:
            self._discard(worker, timeout=2.0)
        self.running.clear()
        self.idle.clear()


def _run_local(
    cells: list[dict[str, Any]], base_dir: str, workers: int, address: str | None
) -> Iterator[dict[str, Any]]:
    pool = _Pool(workers, base_dir)
    try:
        yield from pool.run(cells)
    finally:
        pool.close()


def _run_ray(
    cells: list[dict[str, Any]], base_dir: str, workers: int, address: str | None
) -> Iterator[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise InputError("the ray executor needs Ray: pip install 'kvsim[ray]'") from None
    started = False
    if not ray.is_initialized():
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        kwargs: dict[str, Any] = {
            "runtime_env": {"env_vars": {"PYTHONPATH": path}},
            "include_dashboard": False,
            "log_to_driver": False,
        }
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=workers, **kwargs)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(run_cell)
        of = {remote.remote(c, base_dir): c for c in cells}
        pending = list(of)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    row = ray.get(ref)
                except ray.exceptions.RayError as e:  # Ray has retried a dead worker already
                    row = _failed_row(of[ref], f"{type(e).__name__}: {e}")
                yield row
    finally:
        if started:
            ray.shutdown()


_EXECUTORS: dict[str, Callable[..., Iterator[dict[str, Any]]]] = {
    "serial": _run_serial,
    "local": _run_local,
    "ray": _run_ray,
}


# --------------------------------------------------------------------------- journal


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _journal_row(line: bytes) -> dict[str, Any] | None:
    """One journal line as a row, or None when it is not one (corrupt, or no cell_id)."""
    try:
        row = json.loads(line)
    except ValueError:  # bad JSON or bad UTF-8
        return None
    if not isinstance(row, dict) or not isinstance(row.get("cell_id"), str):
        return None
    return row


def read_journal(
    folder: str | os.PathLike[str], on_warning: Warn | None = None
) -> dict[str, dict[str, Any]]:
    """cell_id -> row from ``folder/journal.jsonl``.

    A torn last line (a kill mid-write) is dropped. Any other line that is not a row (bad
    JSON, no ``cell_id``) is skipped with a one-line warning, so its cell runs again."""
    warn = on_warning or _warn
    path = os.path.join(folder, JOURNAL)
    rows: dict[str, dict[str, Any]] = {}
    if not os.path.exists(path):
        return rows
    with open(path, "rb") as f:
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):  # cut the torn tail so later appends start on a fresh line
        with open(path, "r+b") as f:
            f.truncate(len(complete))
    for number, line in enumerate(complete.splitlines(), 1):
        if not line.strip():
            continue
        row = _journal_row(line)
        if row is None:
            warn(f"{path}:{number}: skipped a line that is not a sweep row; its cell runs again")
            continue
        rows[row["cell_id"]] = row  # a later line (a retried cell) wins
    return rows


class _Journal:
    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.f = open(os.path.join(folder, JOURNAL), "a", encoding="utf-8")  # noqa: SIM115

    def append(self, row: dict[str, Any]) -> None:
        self.f.write(json.dumps(row, default=_json_default, allow_nan=True) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


def _json_default(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return str(v)


@contextlib.contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    """One sweep per output folder: two would interleave the journal and race on the
    results. The second is refused at once; the lock goes with the process that holds it."""
    os.makedirs(folder, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no flock (Windows): unlocked
        yield
        return
    with open(os.path.join(folder, LOCK), "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise InputError(
                f"another sweep{by} is writing to this folder; "
                "wait for it to finish or use another --out",
                source=folder,
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------- results


def to_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> the results table: status columns first, then configuration, then metrics."""
    rows = sorted(rows, key=lambda r: r["cell"])
    df = pd.DataFrame.from_records(rows)
    if df.empty:
        return pd.DataFrame(columns=list(STATUS_COLUMNS))
    first = [c for c in STATUS_COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)


def write_results(df: pd.DataFrame, folder: str | os.PathLike[str]) -> list[str]:
    """Write ``results.parquet`` and ``results.csv`` atomically; return their paths."""
    out = []
    pq = os.path.join(folder, "results.parquet")
    with atomic_path(pq) as tmp:
        _parquet_safe(df).to_parquet(tmp, index=False)
    out.append(pq)
    csv = os.path.join(folder, "results.csv")
    with atomic_path(csv) as tmp:
        df.to_csv(tmp, index=False)
    out.append(csv)
    return out


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns mixing types (e.g. numbers and names) become strings for Parquet."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            kinds = {
                type(v)
                for v in df[c]
                if v is not None and not (isinstance(v, float) and math.isnan(v))
            }
            if len(kinds) > 1:
                df[c] = df[c].map(lambda v: None if v is None else str(v))
    return df


# --------------------------------------------------------------------------- API


def _check_run(executor: str, workers: int | None) -> int:
    if executor not in _EXECUTORS:
        raise InputError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if workers is None:
        return os.cpu_count() or 1
    if not _is_int(workers) or workers < 1:
        raise InputError(f"workers must be an integer >= 1, got {_shown(workers)}")
    return workers


def _reusable(row: Mapping[str, Any], key: str, retry_failed: bool) -> bool:
    """A journaled row stands for its cell only if it ran on the same trace content with the
    same kvsim (rows without a key, from before keys, never really count) and, under
    ``retry_failed``, only if it succeeded."""
    if row.get("run_key") != key:
        return False
    return row.get("status") == "ok" or not retry_failed


def _table_row(row: Mapping[str, Any], cell: int) -> dict[str, Any]:
    """A journal row as a results-table row (the run key stays in the journal)."""
    return {"cell": cell, **{k: v for k, v in row.items() if k not in ("cell", "run_key")}}


def sweep(
    spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec,
    *,
    out: str | os.PathLike[str] | None = None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    retry_failed: bool = False,
    on_row: Callable[[dict[str, Any], int, int], None] | None = None,
    on_warning: Warn | None = None,
    progress: ProgressArg = None,
) -> pd.DataFrame:
    """Run every cell of ``spec`` and return the results table (one row per cell).

    ``executor``: ``local`` (process pool, default), ``serial`` (this process) or ``ray``
    (``address`` of a cluster, else a local Ray with ``workers`` CPUs). With ``out``, rows are
    journaled there and cells already journaled for the same trace content and kvsim version
    are not run again (``retry_failed`` re-runs the failed ones); a second sweep into a folder
    in use is refused. ``on_row(row, done, total)`` is called after each finished cell;
    ``on_warning(message)`` gets skipped journal lines (default: :mod:`warnings`).
    ``progress=True`` shows a bar counting finished cells (a widget in a notebook, lines in
    a log file); a callable is called as ``progress(n)`` as cells finish.
    """
    s = SweepSpec.load(spec)
    workers = _check_run(executor, workers)
    cells = s.cells()
    ids = [cell_id(c) for c in cells]
    if len(set(ids)) != len(ids):
        raise InputError("the sweep has duplicate cells (repeated trace or grid values)")
    base_dir = os.getcwd()
    plan = _Plan(cells, ids, _run_keys(cells, ids, base_dir), base_dir, executor, workers, address)
    with Progress(progress, len(cells), "sweep", unit="cell") as bar:
        on_row = _with_progress(on_row, bar.callback)
        if out is None:
            return _execute(plan, {}, None, on_row)
        folder = os.fspath(out)
        with _folder_lock(folder):
            write_metadata(folder, s.traces, dataclasses.asdict(s), command="sweep")
            journal_rows = read_journal(folder, on_warning)
            done = {
                i: r
                for i, r in journal_rows.items()
                if i in plan.keys and _reusable(r, plan.keys[i], retry_failed)
            }
            return _execute(plan, done, folder, on_row)


def _with_progress(
    on_row: Callable[[dict[str, Any], int, int], None] | None,
    tick: Callable[[int], None] | None,
) -> Callable[[dict[str, Any], int, int], None] | None:
    """``on_row`` that also moves a progress bar up to the number of finished cells
    (resumed cells included)."""
    if tick is None:
        return on_row
    shown = 0

    def counted(row: dict[str, Any], done: int, total: int) -> None:
        nonlocal shown
        tick(done - shown)
        shown = done
        if on_row is not None:
            on_row(row, done, total)

    return counted


@dataclass
class _Plan:
    """One sweep call's cells (with their ids and run keys) and where they run."""

    cells: list[dict[str, Any]]
    ids: list[str]
    keys: dict[str, str]
    base_dir: str
    executor: str
    workers: int
    address: str | None


def _execute(
    plan: _Plan,
    done: dict[str, dict[str, Any]],
    folder: str | None,
    on_row: Callable[[dict[str, Any], int, int], None] | None,
) -> pd.DataFrame:
    """Run the cells not ``done``, journaling each row into ``folder`` as it comes; the
    results files are rewritten from every row on the way out, interrupted or not."""
    index = {i: n for n, i in enumerate(plan.ids)}
    rows = [_table_row(r, index[i]) for i, r in done.items()]
    todo = [c for c, i in zip(plan.cells, plan.ids) if i not in done]
    total, finished = len(plan.cells), len(rows)
    journal = _Journal(folder) if folder is not None else None
    run = _EXECUTORS[plan.executor]
    try:
        if todo:
            workers = min(plan.workers, len(todo))
            for row in _sharing_baselines(todo, run(todo, plan.base_dir, workers, plan.address)):
                row = _table_row(row, index[row["cell_id"]])
                if journal is not None:
                    journal.append({**row, "run_key": plan.keys[row["cell_id"]]})
                rows.append(row)
                finished += 1
                if on_row is not None:
                    on_row(row, finished, total)
    finally:
        if journal is not None:
            journal.close()
            if rows:
                write_results(to_frame(rows), journal.folder)
    return to_frame(rows)
