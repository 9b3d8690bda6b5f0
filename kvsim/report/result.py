"""Run results as values: a summary mapping plus named pandas tables."""

from __future__ import annotations

import contextlib
import json
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from kvsim.core.errors import InputError
from kvsim.core.input_files import referenced_files
from kvsim.core.io import atomic_write, json_text, refuse_filling_folder
from kvsim.report.labels import format_metric, format_value

if TYPE_CHECKING:  # pandas loads with the first table (start-up: see kvsim.cli)
    import pandas as pd


@dataclass(repr=False)
class Result:
    """What a run returns. ``summary`` is flat (name -> number/str); ``tables`` are tidy.

    Tables read as attributes too (``result.requests``). In a notebook a Result shows its
    headline metrics and its tables; :meth:`compare` puts two runs (or a run and its
    ``baseline=True`` twin) side by side, :meth:`save` writes it as ``kvsim simulate --out``
    does."""

    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    #: summary keys of a ``simulate(..., baseline=True)`` run's offload-free twin start so
    BASELINE_PREFIX: ClassVar[str] = "baseline_"
    #: the metrics a Result shows first, in this order, when it has them
    HEADLINE: ClassVar[tuple[str, ...]] = (
        "requests",
        "combined_hit_ratio",
        "cpu_hit_ratio",
        "gpu_hit_ratio",
        "chunks_stored",
        "chunks_evicted",
        "median_ttft_ms",
        "p99_ttft_ms",
        "median_tpot_ms",
        "output_throughput",
        "total_token_throughput",
        "cpu_hit_tokens",
        "load_bytes",
        "store_bytes",
        "preemptions",
    )

    def __getattr__(self, name: str) -> pd.DataFrame:
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(name)

    def summary_frame(self) -> pd.DataFrame:
        """The summary as a two-column (metric, value) table, in insertion order."""
        import pandas as pd

        return pd.DataFrame({"metric": list(self.summary), "value": list(self.summary.values())})

    # --- looking at it ---

    def headline(self) -> dict[str, Any]:
        """The metrics worth a first look: :attr:`HEADLINE`'s that this run has (its first
        eight summary entries when it has none of them), baseline twins left out."""
        shown = {k: self.summary[k] for k in self.HEADLINE if k in self.summary}
        if not shown:
            first = [k for k in self.summary if not k.startswith(self.BASELINE_PREFIX)][:8]
            shown = {k: self.summary[k] for k in first}
        return shown

    def _title(self) -> str:
        s = self.summary
        where = f" on {s['model']} / {s['gpu']}" if "model" in s and "gpu" in s else ""
        return f"Result({s.get('trace', 'run')}{where})"

    def _table_shapes(self) -> list[str]:
        return [f"{n} ({len(df):,} x {df.shape[1]})" for n, df in self.tables.items()]

    def __repr__(self) -> str:
        lines = [self._title()]
        items = self.headline()
        width = max((len(k) for k in items), default=0)
        lines += [f"  {k:<{width}}  {format_metric(k, v)}" for k, v in items.items()]
        more = len(self.summary) - len(items)
        if more > 0:
            lines.append(f"  ... {more} more in .summary")
        shapes = self._table_shapes()
        lines.append("  tables: " + (", ".join(shapes) if shapes else "none"))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """Jupyter's view: the headline metrics, the whole summary folded, the tables."""
        from html import escape  # a notebook's; a command never draws HTML

        def rows(items: Mapping[str, Any]) -> str:
            return "".join(
                f"<tr><td style='text-align:left'>{escape(k)}</td>"
                f"<td style='text-align:right'>{escape(format_metric(k, v))}</td></tr>"
                for k, v in items.items()
            )

        shapes = self._table_shapes()
        return (
            f"<div><b>{escape(self._title())}</b>"
            f"<table>{rows(self.headline())}</table>"
            f"<details><summary>all {len(self.summary)} summary metrics</summary>"
            f"<table>{rows(self.summary)}</table></details>"
            f"<p>tables: {escape(', '.join(shapes) if shapes else 'none')}</p></div>"
        )

    # --- two runs side by side ---

    def compare(
        self, other: Result | None = None, metrics: Iterable[str] | None = None
    ) -> pd.DataFrame:
        """This run against ``other``, or, without one, a ``simulate(baseline=True)`` run
        against its run without offloading: one row per metric with both values, their
        ``difference`` (this - other) and ``ratio`` (this / other; NaN when other is 0).

        ``metrics`` picks rows (default: every numeric metric both sides have; one name is
        one metric)."""
        if other is not None and not isinstance(other, Result):
            raise InputError(f"compare(): other is a Result, got {type(other).__name__}")
        if isinstance(metrics, str):
            metrics = [metrics]
        if other is not None:
            left, right, names = self.summary, other.summary, ("this", "other")
        else:
            n = len(self.BASELINE_PREFIX)
            right = {
                k[n:]: v for k, v in self.summary.items() if k.startswith(self.BASELINE_PREFIX)
            }
            if not right:
                raise InputError(
                    "compare(): give another Result, or run simulate(..., baseline=True) "
                    "to compare with the same run without offloading"
                )
            left, names = self.summary, ("offload", "no offload")
        keys = list(metrics) if metrics is not None else [k for k in left if k in right]
        unknown = [k for k in keys if k not in left or k not in right]
        if unknown:
            raise InputError(f"compare(): metric(s) not in both runs: {', '.join(unknown)}")
        numeric = [k for k in keys if self._number(left[k]) and self._number(right[k])]
        import pandas as pd

        a = pd.Series([float(left[k]) for k in numeric], index=numeric, dtype=float)
        b = pd.Series([float(right[k]) for k in numeric], index=numeric, dtype=float)
        ratio = a / b.where(b != 0)
        from kvsim.report.comparison import Comparison

        frame = Comparison({names[0]: a, names[1]: b, "difference": a - b, "ratio": ratio})
        frame.index.name = "metric"
        return frame

    # --- on disk ---

    def save(self, folder: str | os.PathLike[str]) -> list[str]:
        """Write the run into ``folder`` as ``kvsim simulate --out`` does, and return the file
        names: each table as Parquet and CSV, ``summary.json``, ``config.json``, a timed run's
        ``bench.json`` (``vllm bench serve``'s result JSON) and ``metadata.json`` (kvsim
        version, trace hash, config), each file atomically, as one set. The completion marker
        (:data:`RUN_MARKER`) goes first (readers then know the set is being replaced), every
        file is written, an earlier run's files this one does not write are removed, and the
        marker listing the new set goes last."""
        out = os.fspath(folder)
        inputs = referenced_files([self.summary.get("trace"), self.config])
        refuse_filling_folder("folder", out, run_folder_receives(out, self.tables), inputs)
        os.makedirs(out, exist_ok=True)
        marker = os.path.join(out, RUN_MARKER)
        previous: list[str] = []
        if os.path.exists(marker):
            with (
                contextlib.suppress(OSError, ValueError, RecursionError),
                open(marker, encoding="utf-8") as f,
            ):
                previous = list(json.load(f).get("files", []))
            os.unlink(marker)
        from kvsim.report.tables import write_table

        written = []
        for name, df in self.tables.items():
            written += write_table(df, out, name)
        from kvsim.report.serve_metrics import bench_documents  # a timed run: vLLM's result JSON

        documents = {
            "summary": self.summary,
            "config": self.config,
            **bench_documents(self.summary, self.config, self.tables, self.BASELINE_PREFIX),
        }
        for name, data in documents.items():
            with atomic_write(os.path.join(out, f"{name}.json")) as f:
                f.write(json_text(data))
            written.append(f"{name}.json")
        written.append(write_metadata(out, [self.summary.get("trace")], self.config))
        for stale in set(previous) - set(written):
            if os.path.basename(stale) == stale:  # only plain names the marker listed
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(out, stale))
        with atomic_write(marker) as f:
            json.dump({"complete": True, "files": written}, f, indent=2)
        return written

    @staticmethod
    def _number(v: Any) -> bool:
        return isinstance(v, numbers.Real) and not isinstance(v, bool)


def format_table(rows: Mapping[str, Any] | list[tuple[str, Any]], title: str | None = None) -> str:
    """A plain two-column text table (what the CLI prints)."""
    items = list(rows.items()) if isinstance(rows, Mapping) else list(rows)
    width = max((len(k) for k, _ in items), default=0)
    lines = [title, "-" * len(title)] if title else []
    lines += [f"{k:<{width}}  {format_value(v)}" for k, v in items]
    return "\n".join(lines)


#: written last into a ``simulate --out`` folder: the run's files, complete. A folder with
#: tables but without it is a run that failed or was interrupted mid-write.
RUN_MARKER = ".kvsim-run.json"


#: the tables a run folder may hold (each as .parquet and .csv; a baseline's with
#: :attr:`Result.BASELINE_PREFIX`), and its JSON documents
RUN_TABLES = ("requests", "transfers", "steps", "tokens", "tier_jobs", "metrics")
RUN_DOCUMENTS = ("summary.json", "config.json", "bench.json", "metadata.json", RUN_MARKER)


def run_folder_file(name: str) -> bool:
    """Whether :meth:`Result.save` may write a file called ``name`` (it removes others only
    when its last marker lists them: see :func:`run_folder_receives`)."""
    name = name.removeprefix(Result.BASELINE_PREFIX)
    stem, ext = os.path.splitext(name)
    return name in RUN_DOCUMENTS or (ext in (".parquet", ".csv") and stem in RUN_TABLES)


def run_folder_receives(
    folder: str | os.PathLike[str], tables: Iterable[str] = ()
) -> Callable[[str], bool]:
    """Which names in ``folder`` a :meth:`Result.save` into it writes or removes: a run's
    files (and those of ``tables``, beyond :data:`RUN_TABLES`), and what the folder's
    completion marker lists (an earlier run's, removed)."""
    listed = {f"{t}.{ext}" for t in tables for ext in ("parquet", "csv")}
    marker = os.path.join(folder, RUN_MARKER)
    with (
        contextlib.suppress(OSError, ValueError, TypeError, AttributeError, RecursionError),
        open(marker, encoding="utf-8") as f,
    ):
        listed |= {str(n) for n in json.load(f).get("files", [])}
    return lambda name: run_folder_file(name) or name in listed


def check_run_folder(folder: str) -> None:
    """Refuse to read a ``simulate --out`` folder whose set of files is incomplete or mixed."""
    marker = os.path.join(folder, RUN_MARKER)
    if not os.path.exists(os.path.join(folder, "summary.json")):
        return  # not a simulate folder (a sweep's, say)
    if not os.path.exists(marker):
        raise InputError(
            "incomplete run folder (no completion marker: a failed or interrupted "
            "kvsim simulate --out, or an older kvsim); run it again",
            source=folder,
        )


#: in every folder kvsim writes (simulate --out, sweep --out, trace stats --plot): what made it
METADATA = "metadata.json"


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of a file's bytes (read in 1 MiB pieces); None for what is not a plain file
    (an in-memory trace, a stream)."""
    import hashlib

    if not os.path.isfile(path):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


def trace_identity(trace: Any) -> dict[str, Any]:
    """A trace as metadata: its path and content hash, or what it was when not a file."""
    if isinstance(trace, (str, os.PathLike)):
        path = os.fspath(trace)
        sha = file_sha256(path)
        return {
            "path": path,
            "sha256": sha,
            "bytes": os.path.getsize(path) if sha is not None else None,
        }
    if isinstance(trace, Mapping):
        return {"generated": dict(trace)}  # a generator's spec: the trace follows from it
    return {"in_memory": type(trace).__name__}


def kvsim_version() -> str:
    """The installed kvsim's version (a new version may change results: it is in run
    metadata and in sweep cache keys)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvsim")
    except PackageNotFoundError:
        return "unknown"


def run_metadata(
    traces: Iterable[Any], config: Mapping[str, Any], command: str | None = None
) -> dict[str, Any]:
    """What makes a run reproducible: kvsim's version, what made it (``command``), each
    trace's content hash, the whole resolved configuration (every option, defaults too)."""
    out: dict[str, Any] = {"kvsim_version": kvsim_version()}
    if command is not None:
        out["command"] = command
    out["traces"] = [trace_identity(t) for t in traces]
    out["config"] = dict(config)
    return out


def write_metadata(
    folder: str | os.PathLike[str],
    traces: Iterable[Any],
    config: Mapping[str, Any],
    command: str | None = None,
) -> str:
    """Write :data:`METADATA` into ``folder`` atomically (see :func:`run_metadata`); returns
    its file name. Every folder kvsim writes gets one, through this one function."""
    os.makedirs(folder, exist_ok=True)
    with atomic_write(os.path.join(folder, METADATA)) as f:
        f.write(json_text(run_metadata(traces, config, command)))
    return METADATA
