"""Sweeps: traces x options grid -> one tidy table, one row per cell.

The package, one job per module:

* :mod:`~kvsim.sweeps.spec`: the sweep spec (YAML or a mapping) checked whole before any
  cell runs; :mod:`~kvsim.sweeps.tier_sets`: the ``tiers`` axis (secondary-tier sets);
* :mod:`~kvsim.sweeps.cells`: the grid expanded into cells, and one cell run into one row;
  :mod:`~kvsim.sweeps.baselines`: the offload-free baselines a timed sweep's cells share;
  :mod:`~kvsim.sweeps.inputs`: trace paths and generators at run time;
* :mod:`~kvsim.sweeps.executors`: where cells run (this process, a process pool that
  survives worker deaths, Ray);
* :mod:`~kvsim.sweeps.journal`: the output folder's lock, journal and resume keys;
  :mod:`~kvsim.sweeps.cell_tables`: each cell's requests table (``keep_requests``) and
  :func:`read_requests`, which reads them back as one table;
* :mod:`~kvsim.sweeps.run`: :func:`sweep`, which puts them together.

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

from kvsim.sweeps.cell_tables import CELLS, read_requests, table_path
from kvsim.sweeps.cells import STATUS_COLUMNS, cell_id, run_cell
from kvsim.sweeps.executors import CRASH_LIMIT, EXECUTORS
from kvsim.sweeps.inputs import trace_fingerprint
from kvsim.sweeps.journal import JOURNAL, read_journal, run_key
from kvsim.sweeps.run import FOLDER_FILES, MAX_CELLS, sweep, to_frame, write_results
from kvsim.sweeps.spec import SweepSpec, check_value
from kvsim.sweeps.spec_schema import MODES, SweepSpecFile, option_names
from kvsim.sweeps.tier_sets import (
    NO_TIERS,
    TIER_JOIN,
    TIERS,
    tier_set,
    tier_set_label,
    tier_shares,
)

__all__ = [
    "CELLS",
    "CRASH_LIMIT",
    "EXECUTORS",
    "FOLDER_FILES",
    "JOURNAL",
    "MAX_CELLS",
    "MODES",
    "NO_TIERS",
    "STATUS_COLUMNS",
    "TIERS",
    "TIER_JOIN",
    "SweepSpec",
    "SweepSpecFile",
    "cell_id",
    "check_value",
    "option_names",
    "read_journal",
    "read_requests",
    "run_cell",
    "run_key",
    "sweep",
    "table_path",
    "tier_set",
    "tier_set_label",
    "tier_shares",
    "to_frame",
    "trace_fingerprint",
    "write_results",
]
