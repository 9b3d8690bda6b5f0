"""Fleets in sweeps: ``instances`` and ``router`` (and the shared tier) are grid keys; a
fleet cell's row is the fleet run's summary."""

from __future__ import annotations

import pytest
from support import SAMPLE

import kvsim
from kvsim.sweeps import sweep


def test_instances_and_router_are_grid_keys() -> None:
    spec = {
        "traces": [SAMPLE],
        "limit": 80,
        "options": {"cpu_chunks": 40},
        "grid": {"instances": [1, 3], "router": ["round-robin", "prefix-aware"]},
    }
    df = sweep(spec, executor="serial")
    assert len(df) == 4 and (df["status"] == "ok").all(), df["error"].tolist()
    for row in df.itertuples():
        alone = kvsim.replay(
            SAMPLE, limit=80, cpu_chunks=40, instances=row.instances, router=row.router
        ).summary
        assert row.cpu_hit_ratio == alone["cpu_hit_ratio"]
        assert row.max_requests_per_instance == alone["max_requests_per_instance"]


@pytest.mark.filterwarnings("ignore::kvsim.report.serve_metrics.LoadWarning")
def test_a_timed_fleet_cell_runs() -> None:
    spec = {
        "traces": [SAMPLE],
        "mode": "timed",
        "limit": 16,
        "options": {"cpu_gib": 4, "time_scale": 3.0},
        "grid": {"instances": [2], "shared_tier": ["pool"]},
    }
    row = sweep(spec, executor="serial").iloc[0]
    assert row.status == "ok", row.error
    assert row.instances == 2 and row.requests == 16


def test_a_bad_router_in_a_grid_is_a_bad_spec() -> None:
    spec = {"traces": [SAMPLE], "grid": {"router_staleness_ms": [-1]}}
    with pytest.raises(kvsim.InputError, match="router_staleness_ms"):
        sweep(spec, executor="serial")
