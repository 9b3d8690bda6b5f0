"""``Result.compare()``'s table: numbers for code, the CLI's labels and formats for people.

Its own module so that importing :mod:`kvsim.report.result` (every command does) loads no
pandas: a class derived from ``DataFrame`` needs pandas when it is defined."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvsim.report.labels import format_metric, label_of


class Comparison(pd.DataFrame):
    """:meth:`Result.compare`'s table: numbers keyed by metric (``.loc["mean_ttft_ms"]``),
    shown with the CLI's labels, units and number formats (:mod:`kvsim.report.labels`)."""

    @property
    def _constructor(self) -> type:
        return Comparison

    def formatted(self) -> Any:
        """The table as text cells: label with unit as the index, values as the CLI prints
        them (differences signed, ratios with four decimals)."""
        rows = {}
        for key, r in self.iterrows():
            cells = {}
            for col, v in r.items():
                value = float(v)
                if col == "ratio":
                    cells[col] = "-" if value != value else f"{value:.4f}"
                elif value.is_integer() and abs(value) < 2**53:  # counts stay counts
                    cells[col] = format_metric(str(key), int(value), signed=col == "difference")
                else:
                    cells[col] = format_metric(str(key), value, signed=col == "difference")
            rows[label_of(str(key))] = cells
        out = pd.DataFrame.from_dict(rows, orient="index", columns=list(self.columns))
        out.index.name = "metric"
        return out

    def __repr__(self) -> str:
        return str(self.formatted().to_string())

    def _repr_html_(self) -> str:
        return str(self.formatted().to_html())
