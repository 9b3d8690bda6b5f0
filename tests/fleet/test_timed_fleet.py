"""Fleets in timed mode (issue 26 §7): N engines in one event loop. A fleet of one is the
engine, round-robin over two is two engines on the split trace, a zero-capacity shared
tier is none, session routing is sticky, runs are deterministic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support import SAMPLE, run_main

import kvsim
from kvsim.report.serve_metrics import LoadWarning
from kvsim.traces import Request, as_trace

pytestmark = pytest.mark.filterwarnings("ignore::kvsim.report.serve_metrics.LoadWarning")

OPTS = dict(cpu_gib=4, gpu_blocks=3000, time_scale=3.0)
assert LoadWarning  # the marker's class


def _requests(limit: int = 48) -> list[Request]:
    return list(as_trace(SAMPLE, limit=limit))


def _same(a, b) -> bool:
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def _csv(frame) -> str:
    return frame.to_csv(index=False)


@pytest.mark.parametrize(
    "extra",
    [{}, {"async_scheduling": False}, {"secondary_tiers": [{"type": "fs"}]}, {"cpu_gib": None}],
    ids=["async", "sync", "tiered", "no-offload"],
)
def test_fleet_of_one_is_the_engine(extra) -> None:
    opts = {**OPTS, **extra}
    one = kvsim.simulate(_requests(), **opts)
    fleet = kvsim.simulate(_requests(), **opts, instances=1, router="prefix-aware")
    for name, table in one.tables.items():
        if name == "metrics":
            continue
        assert _csv(fleet.tables[name].drop(columns="instance")) == _csv(table), name
    for key, value in one.summary.items():
        assert _same(fleet.summary[key], value), key


def test_round_robin_over_two_is_two_engines_on_the_split_trace() -> None:
    reqs = _requests()
    fleet = kvsim.simulate(reqs, **OPTS, instances=2, router="round-robin")
    for name in ("requests", "steps", "transfers"):
        table = fleet.tables[name]
        for i in range(2):
            alone = kvsim.simulate(reqs[i::2], **OPTS).tables[name]
            mine = table[table["instance"] == i].drop(columns="instance")
            assert _csv(mine.reset_index(drop=True)) == _csv(alone), (name, i)
    assert fleet.summary["steps"] == fleet.tables["steps"].shape[0]
    assert list(fleet.tables["requests"]["request"]) == [r.request_id for r in reqs]


def test_the_fleets_steps_table_is_the_instances_tables_concatenated_and_let_go() -> None:
    """The fleet joins its instances' steps tables column by column, freeing each as it
    goes: the same table, dtypes and index as ``pd.concat`` of each with its ``instance``,
    instances of any length (none too), and the instances' tables are left without columns
    (a column still held would be the whole table twice)."""
    import pandas as pd

    from kvsim.fleet.timed_fleet import _join_steps

    rng = np.random.default_rng(7)
    parts = [
        (i, {"steps": pd.DataFrame({"step": np.arange(n), "end_s": rng.random(n)}, copy=False)})
        for i, n in ((0, 5), (2, 0), (3, 9))
    ]
    expected = pd.concat(
        [t["steps"].assign(instance=i) for i, t in parts], ignore_index=True
    ).copy()
    joined = _join_steps(parts)
    pd.testing.assert_frame_equal(joined, expected, check_exact=True)
    assert all(t["steps"].shape == (n, 0) for (_, t), n in zip(parts, (5, 0, 9)))


def test_session_routing_keeps_each_session_on_one_instance() -> None:
    reqs = [
        Request(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes, i % 5)
        for i, r in enumerate(_requests())
    ]
    table = kvsim.simulate(reqs, **OPTS, instances=3, router="session").tables["requests"]
    sessions = {r.request_id: r.session_id for r in reqs}
    assert (table.groupby(table["request"].map(sessions))["instance"].nunique() == 1).all()


def test_shared_tier_of_zero_capacity_is_no_shared_tier() -> None:
    none = kvsim.simulate(_requests(), **OPTS, instances=2, router="least-loaded")
    zero = kvsim.simulate(
        _requests(),
        **OPTS,
        instances=2,
        router="least-loaded",
        shared_tier="pool",
        shared_tier_capacity="0chunks",
    )
    cols = ["request", "instance", "gpu_hit_tokens", "cpu_hit_tokens", "ttft_s", "finish_s"]
    assert _csv(zero.tables["requests"][cols]) == _csv(none.tables["requests"][cols])
    assert zero.summary["shared_hit_tokens"] == 0


def test_a_shared_pool_lets_an_instance_load_what_another_stored() -> None:
    a = Request(0, 0.0, 8192, 4, tuple(range(16)))
    b = Request(1, 5.0, 8192, 4, tuple(range(16)))
    alone = kvsim.simulate([a, b], cpu_gib=4, instances=2, router="round-robin")
    pooled = kvsim.simulate(
        [a, b], cpu_gib=4, instances=2, router="round-robin", shared_tier="pool"
    )
    assert alone.summary["cpu_hit_tokens"] == 0
    assert pooled.summary["shared_hit_tokens"] > 0
    table = pooled.tables["instances"]
    assert table["shared_hit_tokens"].tolist()[0] == 0 and table["shared_hit_tokens"][1] > 0
    # the table splits the shared tier's hits out of the CPU tier's; the summary counts both
    assert (table["cpu_hit_tokens"] + table["shared_hit_tokens"]).sum() == pooled.summary[
        "cpu_hit_tokens"
    ]
    slow = kvsim.simulate(
        [a, b],
        cpu_gib=4,
        instances=2,
        router="round-robin",
        shared_tier="pool",
        shared_tier_link="nic-100g",
    )
    ttft = lambda r: r.tables["requests"].set_index("request")["ttft_s"][1]  # noqa: E731
    assert ttft(slow) > ttft(pooled)  # the copy queues on a slower link


def test_timed_runs_are_deterministic() -> None:
    for router in ("random", "prefix-aware"):
        a = kvsim.simulate(_requests(), **OPTS, instances=3, router=router)
        b = kvsim.simulate(_requests(), **OPTS, instances=3, router=router)
        assert _csv(a.tables["requests"]) == _csv(b.tables["requests"])


def test_staleness_piles_a_burst_onto_one_instance() -> None:
    burst = [Request(i, 0.001 * i, 2048, 64, (1000 + i,)) for i in range(12)]
    fresh = kvsim.simulate(burst, cpu_gib=4, instances=4, router="least-loaded")
    stale = kvsim.simulate(
        burst, cpu_gib=4, instances=4, router="least-loaded", router_staleness_ms=50
    )
    assert fresh.summary["max_requests_per_instance"] == 3
    assert stale.summary["max_requests_per_instance"] == 12


def test_simulate_cli_runs_a_fleet(capsys) -> None:
    code, out, err = run_main(
        [
            "simulate", SAMPLE, "--cpu-gib", "4", "--limit", "20", "--instances", "2",
            "--router", "round-robin", "--time-scale", "3", "--json",
        ],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert '"instances": 2' in out
    code, out, err = run_main(
        ["simulate", SAMPLE, "--limit", "5", "--instances", "2", "--shared-tier", "pool"], capsys
    )
    assert code == 2 and "give it a size" in err and len(err.strip().splitlines()) == 1


def test_timed_fleets_are_deterministic_across_hash_seeds() -> None:
    import os
    import subprocess
    import sys

    from support import ROOT

    args = [
        sys.executable, "-m", "kvsim", "simulate", SAMPLE, "--cpu-gib", "4", "--limit", "12",
        "--instances", "3", "--router", "session", "--shared-tier", "pool", "--json",
    ]  # fmt: skip
    outs = set()
    for seed in ("0", "7"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        outs.add(subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout)
    assert len(outs) == 1


WORKLOAD = {
    "type": "shared_prefix",
    "num_groups": 3,
    "num_prompts_per_group": 4,
    "system_prompt_len": 2000,
    "question_len": 256,
    "output_len": 32,
}
CLOSED = {
    "type": "concurrency",
    "stages": [{"concurrency": 3, "num_requests": 12}, {"concurrency": 5, "num_requests": 10}],
}


def test_a_fleet_runs_an_open_workload() -> None:
    open_load = {"type": "poisson", "stages": [{"rate": 2, "duration": 6}]}
    run = kvsim.simulate(
        workload=WORKLOAD, load=open_load, cpu_gib=8, instances=2, router="prefix-aware"
    )
    assert run.summary["instances"] == 2 and run.summary["requests"] > 0
    assert list(run.tables["stages"]["stage"]) == [0, "all"]


@pytest.mark.parametrize(
    "extra, timing",
    [({}, "ideal"), ({"async_scheduling": False}, "ideal"), ({}, "inference-perf")],
    ids=["async", "sync", "drained-stages"],
)
def test_a_fleet_of_one_runs_the_closed_loop_of_one_engine(extra, timing) -> None:
    load = {**CLOSED, "timing": timing}  # inference-perf's: a stage waits for the last to drain
    opts = dict(workload=WORKLOAD, load=load, cpu_gib=8, gpu_blocks=400, **extra)
    one = kvsim.simulate(**opts)
    fleet = kvsim.simulate(**opts, instances=1, router="prefix-aware")
    assert set(fleet.tables) == set(one.tables) | {"instances"}
    for name, table in one.tables.items():
        if name == "metrics":
            continue
        mine = fleet.tables[name]
        if "instance" in mine:
            mine = mine.drop(columns="instance")
        assert _csv(mine) == _csv(table), name
    for key, value in one.summary.items():
        assert _same(fleet.summary[key], value), key


def test_a_closed_loop_across_a_fleet_keeps_n_requests_in_flight() -> None:
    """N clients for the whole fleet: a send (after the first N) is the finish, on any
    instance, that freed its client; so never more than N in flight, and N most of the
    time."""
    load = {"type": "concurrency", "stages": [{"concurrency": 4, "num_requests": 20}]}
    run = kvsim.simulate(
        workload=WORKLOAD, load=load, cpu_gib=8, gpu_blocks=400, instances=3, router="random"
    )
    reqs = run.tables["requests"].sort_values("request")
    assert reqs["instance"].nunique() == 3 and len(reqs) == 20
    arrival, finish = reqs["arrival_s"].to_numpy(), reqs["finish_s"].to_numpy()
    in_flight = [((arrival <= t) & (finish > t)).sum() for t in arrival]
    assert max(in_flight) == 4 and min(in_flight[:17]) == 4
    # request j >= 4 is sent at the (j - 3)-th finish, whichever instance ran it
    assert np.array_equal(arrival[4:], np.sort(finish)[:16])
    assert run.tables["stages"]["completed"].tolist() == [20, 20]


def test_a_closed_loop_fleet_is_deterministic() -> None:
    opts = dict(workload=WORKLOAD, load=CLOSED, cpu_gib=8, instances=3, router="prefix-aware")
    a, b = kvsim.simulate(**opts), kvsim.simulate(**opts)
    assert _csv(a.tables["requests"]) == _csv(b.tables["requests"])


def test_a_fleet_whose_requests_keep_their_keys_and_context_has_the_same_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each instance's engine drops a finished request's keys and context (its recorder
    keeps the request for its row): the fleet's tables equal those of a run keeping them."""
    from kvsim.engine.request_state import SimRequest

    reqs = _requests()
    opts = {**OPTS, "instances": 2, "router": "prefix-aware"}
    lean = kvsim.simulate(reqs, **opts)
    monkeypatch.setattr(SimRequest, "retire", lambda self: None)
    kept = kvsim.simulate(reqs, **opts)
    assert lean.tables["transfers"].shape[0] > 0
    for name in ("requests", "steps", "transfers"):
        assert _csv(lean.tables[name]) == _csv(kept.tables[name]), name
