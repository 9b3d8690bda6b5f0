"""Offload-free baselines shared by a timed sweep's cells.

A timed cell with ``baseline: true`` runs twice: with offloading and without. The run without
offloading never reads the CPU tier's options, so every cell that differs only in them
(policy, size, admission, tier set) would repeat the same baseline; instead the first such
cell runs it and writes its ``baseline_*`` metrics to a folder the sweep's processes share,
and the others read it (a file lock makes them wait for the first). A row is the same as the
cell run alone: ``tests/traces/test_trace_cache.py`` checks it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kvsim.core.io import atomic_path
from kvsim.sweeps.inputs import trace_fingerprint
from kvsim.sweeps.journal import json_default
from kvsim.sweeps.tier_sets import TIERS

if TYPE_CHECKING:
    from kvsim.report.result import Result

#: names the folder a sweep's processes share while it runs: one offload-free baseline per
#: (trace, engine configuration), run by the first timed cell that needs it
BASELINES_ENV = "KVSIM_SWEEP_BASELINES"
#: where a shared baseline keeps its load warnings, so that a cell reading it warns as the
#: cell alone would
_WARNINGS = "__warnings__"
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


def timed_run(
    trace: Any, limit: int | None, options: dict[str, Any], baseline_key: Callable[[], str]
) -> Result:
    """``simulate(trace, limit=limit, **options)``, taking its baseline from the shared
    folder when another cell of the same engine configuration has run it (its summary's
    ``baseline_*`` metrics then come from there, and it has no ``baseline_*`` tables).

    Args:
        trace: what ``simulate`` reads (a path or requests).
        limit: requests to read, or None for all.
        options: the cell's ``simulate`` keywords.
        baseline_key: the cell's key among the shared baselines (called only when shared).

    Returns:
        the run, ``baseline_*`` metrics included when ``options["baseline"]``.
    """
    try:
        from kvsim.api import BASELINE_PREFIX, simulate
        from kvsim.report import serve_metrics
    except ImportError as e:
        raise RuntimeError(f"timed mode is not available in this kvsim build ({e})") from None
    folder = os.environ.get(BASELINES_ENV)
    if not options.get("baseline") or folder is None or not _can_lock():
        return simulate(trace, limit=limit, **options)
    path = os.path.join(folder, f"{baseline_key()}.json")
    with _locked(path + ".lock"):
        shared = _read_baseline(path)
        if shared is None:  # the first cell of this configuration: it runs the baseline
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = simulate(trace, limit=limit, **options)
            summary = result.summary
            said = []
            for w in caught:  # passed on; the baseline's own are kept for the other cells
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
                if issubclass(w.category, serve_metrics.LoadWarning) and serve_metrics.warns_about(
                    str(w.message), serve_metrics.RUN_WITHOUT_OFFLOAD
                ):
                    said.append([w.category.__name__, str(w.message)])
            base = {k: v for k, v in summary.items() if k.startswith(BASELINE_PREFIX)}
            base[_WARNINGS] = said
            with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
                json.dump(base, f, default=json_default, allow_nan=True)
            return result
    result = simulate(trace, limit=limit, **{**options, "baseline": False})
    for category, message in shared.pop(_WARNINGS, []):  # as the cell alone would warn
        kind = getattr(serve_metrics, category, serve_metrics.LoadWarning)
        warnings.warn(message, kind, stacklevel=2)
    result.summary.update(shared)
    return result


def baseline_key(cell: Mapping[str, Any], base_dir: str | None) -> str:
    """What a timed run without offloading depends on: the trace (and its content), the
    limit, and every option but the CPU tier's."""
    engine = {k: v for k, v in cell.items() if k not in _CPU_TIER_OPTIONS}
    engine["fingerprint"] = trace_fingerprint(cell["trace"], base_dir)
    text = json.dumps(engine, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def sharing_baselines(shared: bool, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The executor's rows, its cells run with a shared baselines folder when ``shared`` (a
    timed sweep whose cells run a baseline)."""
    if not shared:
        yield from rows
        return
    with _shared_folder():
        yield from rows


@contextlib.contextmanager
def _shared_folder() -> Iterator[None]:
    """A folder for this sweep's baselines, named in the environment so that every worker
    it starts on this machine finds it; removed afterwards."""
    saved = os.environ.get(BASELINES_ENV)
    with tempfile.TemporaryDirectory(prefix="kvsim-sweep-baselines-") as folder:
        os.environ[BASELINES_ENV] = folder
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(BASELINES_ENV, None)
            else:
                os.environ[BASELINES_ENV] = saved


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
