"""Run results as values: a summary mapping plus named pandas tables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvsim.errors import InputError


@dataclass
class Result:
    """What a run returns. ``summary`` is flat (name -> number/str); ``tables`` are tidy."""

    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> pd.DataFrame:
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(name)

    def summary_frame(self) -> pd.DataFrame:
        """The summary as a two-column (metric, value) table, in insertion order."""
        return pd.DataFrame({"metric": list(self.summary), "value": list(self.summary.values())})


def format_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


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
