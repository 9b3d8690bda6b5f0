"""Figures from kvsim's tables, all in one style (:mod:`kvsim.plots.style`).

Every function takes DataFrames (or a result), draws into ``ax=`` when given (else a new
figure of the ``preset``'s size: ``"one-column"``, ~3.3 in, or ``"two-column"``, ~7 in,
fonts >= 7 pt at that size) and returns the Figure. Nothing here reads files.

- :func:`hit_vs_capacity`: a sweep results table: a capacity column (``cpu_gib`` or
  ``cpu_chunks``) and a hit ratio; one line per configuration (parameter columns only).
- :func:`tiers_vs_capacity`: a ``kvsim sweep --tier-set`` table: one line per secondary-tier
  set (the ``tiers`` column), hit ratio and, for a timed sweep, median TTFT.
- :func:`mrc`: a ``kvsim mrc`` table (``capacity``, ``hit_ratio``, ``cpu_gib``) or an MRC.
- :func:`ttft_cdf`: a timed-mode requests table with ``ttft_s`` (and its baseline's);
  :func:`sweep_ttft_cdf`: a timed sweep's per-cell requests tables, one line per cell.
- :func:`usage_timeline`: a timed-mode steps table; CPU occupancy = resident / capacity.
- :func:`transfers`, :func:`transfer_bandwidth`, :func:`transfer_durations`: a timed-mode
  transfers table (``direction``, ``bytes``, ``start_s``, ``end_s``).
- :func:`trace_figures` (and one function per figure): trace statistics.
- :func:`fleet_balance`: a fleet run's ``instances`` table: load and hit share per instance.

:func:`save` / :func:`save_as` write PNG, PDF or SVG (by extension) atomically.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvsim.plots.capacity import (
    CAPACITY_COLUMNS,
    hit_vs_capacity,
    mrc,
    mrc_curve,
    mrc_title,
    parameter_names,
    series_columns,
)
from kvsim.plots.fleet import fleet_balance
from kvsim.plots.metric_capacity import metric_vs_capacity
from kvsim.plots.style import (
    DEFAULT_PRESET,
    MIN_FONT_PT,
    PRESETS,
    Preset,
    out_paths,
    save,
    save_all,
    save_as,
)
from kvsim.plots.tiers import tiers_vs_capacity
from kvsim.plots.timed import (
    resample,
    sweep_ttft_cdf,
    transfer_bandwidth,
    transfer_durations,
    transfers,
    ttft_cdf,
    usage_timeline,
)
from kvsim.plots.trace import (
    arrival_rate,
    block_popularity,
    reuse_cdfs,
    token_lengths,
    trace_figures,
)

__all__ = [
    "CAPACITY_COLUMNS",
    "DEFAULT_PRESET",
    "MIN_FONT_PT",
    "PRESETS",
    "Preset",
    "arrival_rate",
    "block_popularity",
    "fleet_balance",
    "hit_vs_capacity",
    "metric_vs_capacity",
    "mrc",
    "mrc_curve",
    "mrc_title",
    "out_paths",
    "parameter_names",
    "plt",
    "resample",
    "reuse_cdfs",
    "save",
    "save_all",
    "save_as",
    "series_columns",
    "sweep_ttft_cdf",
    "tiers_vs_capacity",
    "token_lengths",
    "trace_figures",
    "transfer_bandwidth",
    "transfer_durations",
    "transfers",
    "ttft_cdf",
    "usage_timeline",
]
