"""Fleets in cache mode (issue 26 §7): a fleet of one is the engine, round-robin splits the
trace, session routing is sticky, a zero-capacity shared tier is no shared tier, runs are
deterministic, bad routers are one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import ROOT, SAMPLE, run_main

import kvsim
from kvsim import InputWarning
from kvsim.traces import Request, as_trace

OPTS = dict(cpu_chunks=40, gpu_blocks=30)


def _requests(limit: int = 120) -> list[Request]:
    return list(as_trace(SAMPLE, limit=limit))


def _csv(frame) -> str:
    return frame.to_csv(index=False)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"gpu_blocks": 0},
        {"policy": "arc"},
        {"fused": False},
        {"secondary_tiers": [{"type": "fs"}]},
    ],
    ids=["lru", "lru-whole-blocks", "arc", "protocol", "tiered"],
)
def test_fleet_of_one_is_the_engine(extra) -> None:
    opts = {**OPTS, **extra}
    one = kvsim.replay(SAMPLE, **opts)
    with pytest.warns(kvsim.InputWarning, match="--router .one instance has no router"):
        fleet = kvsim.replay(SAMPLE, **opts, instances=1, router="prefix-aware")
    assert set(fleet.tables["requests"]["instance"]) == {0}
    assert _csv(fleet.tables["requests"].drop(columns="instance")) == _csv(one.tables["requests"])
    for key, value in one.summary.items():
        assert fleet.summary[key] == value, key
    assert fleet.summary["instances"] == 1


def test_round_robin_over_two_is_two_engines_on_the_split_trace() -> None:
    reqs = _requests()
    fleet = kvsim.replay(reqs, **OPTS, instances=2, router="round-robin")
    table = fleet.tables["requests"]
    for i in range(2):
        alone = kvsim.replay(reqs[i::2], **OPTS)
        mine = table[table["instance"] == i].drop(columns="instance").reset_index(drop=True)
        assert _csv(mine) == _csv(alone.tables["requests"])
    assert fleet.summary["requests"] == len(reqs)
    assert fleet.summary["max_requests_per_instance"] == len(reqs) // 2


def test_fleet_summary_sums_counts_and_recomputes_ratios() -> None:
    fleet = kvsim.replay(SAMPLE, **OPTS, instances=3, router="random")
    s, inst = fleet.summary, fleet.tables["instances"]
    assert s["prompt_blocks"] == inst["prompt_blocks"].sum()
    assert s["cpu_hit_blocks"] == inst["cpu_hit_blocks"].sum()
    assert s["cpu_hit_ratio"] == s["cpu_hit_blocks"] / s["prompt_blocks"]
    assert s["cpu_chunks"] == 40  # configuration is per instance
    assert inst["load_share"].sum() == pytest.approx(1.0)


def test_session_routing_keeps_each_session_on_one_instance() -> None:
    reqs = [
        Request(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes, i % 7)
        for i, r in enumerate(_requests())
    ]
    table = kvsim.replay(reqs, **OPTS, instances=4, router="session").tables["requests"]
    sessions = {r.request_id: r.session_id for r in reqs}
    per_session = table.groupby(table["request"].map(sessions))["instance"].nunique()
    assert (per_session == 1).all()
    assert table["instance"].nunique() > 1


def test_session_routing_infers_conversations() -> None:
    # turn 2 repeats turn 1's prompt; the shared system block 0 alone joins nothing
    a1 = Request(0, 0.0, 2048, 10, (0, 1, 2, 3))
    b1 = Request(1, 1.0, 2048, 10, (0, 11, 12, 13))
    a2 = Request(2, 2.0, 3072, 10, (0, 1, 2, 3, 4, 5))
    b2 = Request(3, 3.0, 3072, 10, (0, 11, 12, 13, 14, 15))
    seen = set()
    for n in range(2, 9):
        table = kvsim.replay([a1, b1, a2, b2], cpu_chunks=8, instances=n, router="session").tables[
            "requests"
        ]
        where = dict(zip(table["request"], table["instance"]))
        assert where[0] == where[2] and where[1] == where[3]
        seen.add(where[0] == where[1])
    assert False in seen  # the two conversations are told apart


def test_prefix_aware_follows_the_held_prefix() -> None:
    a1 = Request(0, 0.0, 2048, 10, (0, 1, 2, 3))
    b1 = Request(1, 0.0, 2048, 10, (10, 11, 12, 13))
    a2 = Request(2, 0.0, 2560, 10, (0, 1, 2, 3, 4))
    b2 = Request(3, 0.0, 2560, 10, (10, 11, 12, 13, 14))
    table = kvsim.replay([a1, b1, a2, b2], cpu_chunks=8, instances=2, router="prefix-aware").tables[
        "requests"
    ]
    where = dict(zip(table["request"], table["instance"]))
    assert where[0] != where[1]  # the queue score spreads the cold ones
    assert where[2] == where[0] and where[3] == where[1]
    assert table["cpu_hit_blocks"].tolist()[2:] == [4, 4]


def test_staleness_hides_what_was_routed_just_before() -> None:
    from fleet.router_plugins import Recording

    reqs = [Request(0, 0.0, 2048, 10, (0, 1, 2, 3)), Request(1, 0.5, 2560, 10, (0, 1, 2, 3, 4))]
    held = {}
    for lag_ms in (0, 400, 1000):
        Recording.seen.clear()
        kvsim.replay(
            reqs,
            cpu_chunks=8,
            instances=2,
            router="fleet.router_plugins:Recording",
            router_staleness_ms=lag_ms,
        )
        second = Recording.seen[1]
        held[lag_ms] = (second[0].cpu_hit_tokens, second[0].running)
    assert held == {0: (2048, 1), 400: (2048, 1), 1000: (0, 0)}


def test_shared_tier_of_zero_capacity_is_no_shared_tier() -> None:
    none = kvsim.replay(SAMPLE, **OPTS, instances=3, router="round-robin")
    zero = kvsim.replay(
        SAMPLE,
        **OPTS,
        instances=3,
        router="round-robin",
        shared_tier="pool",
        shared_tier_capacity="0",
    )
    cols = ["request", "instance", "prompt_blocks", "gpu_hit_blocks", "cpu_hit_blocks"]
    assert _csv(zero.tables["requests"][cols]) == _csv(none.tables["requests"][cols])
    for key in ("cpu_hit_ratio", "combined_hit_ratio", "gpu_hit_ratio", "chunks_stored"):
        assert zero.summary[key] == none.summary[key], key
    assert zero.summary["shared_hit_blocks"] == 0


def test_a_shared_pool_serves_one_instance_what_another_stored() -> None:
    reqs = [Request(0, 0.0, 2048, 10, (0, 1, 2, 3)), Request(1, 1.0, 2048, 10, (0, 1, 2, 3))]
    alone = kvsim.replay(reqs, cpu_chunks=8, instances=2, router="round-robin")
    pooled = kvsim.replay(reqs, cpu_chunks=8, instances=2, router="round-robin", shared_tier="pool")
    assert alone.summary["cpu_hit_blocks"] == 0
    assert pooled.summary["shared_hit_blocks"] == 4  # no GPU cache: the CPU tier serves all
    assert pooled.tables["instances"]["shared_hit_blocks"].tolist() == [0, 4]


def test_runs_are_deterministic_across_hash_seeds() -> None:
    args = [
        sys.executable, "-m", "kvsim", "replay", SAMPLE, "--cpu-chunks", "40",
        "--instances", "3", "--router", "prefix-aware", "--shared-tier", "pool",
        "--shared-tier-capacity", "50chunks", "--json",
    ]  # fmt: skip
    outs = []
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        outs.append(
            subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout
        )
    assert outs[0] == outs[1] == outs[2]
    assert json.loads(outs[0])["instances"] == 3
    for router in ("random", "session", "least-loaded"):
        a = kvsim.replay(SAMPLE, **OPTS, instances=3, router=router)
        b = kvsim.replay(SAMPLE, **OPTS, instances=3, router=router)
        assert _csv(a.tables["requests"]) == _csv(b.tables["requests"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--router", "round-robbin"], "did you mean 'round-robin'"),
        (["--router", "fleet.router_plugins:OutOfRange"], "returned 3"),
        (["--router", "fleet.router_plugins:Raises"], "no instance for you"),
        (["--router", "fleet.router_plugins:Nope"], "cannot load the plugin"),
        (["--router-staleness-ms", "-5"], "--router-staleness-ms"),
        (["--instances", "0"], "--instances"),
        (["--shared-tier-capacity", "1TiB"], "needs --shared-tier"),
        (["--shared-tier-eviction", "arc"], "needs --shared-tier"),
        (["--shared-tier", "pool", "--shared-tier-capacity", "lots"], "--shared-tier-capacity"),
    ],
)
def test_bad_fleet_input_is_one_line_and_exit_2(args, needle, capsys) -> None:
    code, out, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", "10", "--instances", "3", *args], capsys
    )
    assert code == 2
    assert out == ""
    assert needle in err and len(err.strip().splitlines()) == 1


def test_a_valid_plugin_routes() -> None:
    table = kvsim.replay(
        SAMPLE, cpu_chunks=10, limit=20, instances=3, router="fleet.router_plugins:Last"
    ).tables["requests"]
    assert set(table["instance"]) == {2}


_POOL = {"instances": 3, "shared_tier": "pool"}


@pytest.mark.parametrize(
    ("options", "unread"),
    [
        ({}, []),
        ({"instances": 3, "router": "prefix-aware", "router_kv_weight": 0.0}, []),
        ({"router": "session"}, ["--router"]),
        (
            {"router_staleness_ms": 5.0, "router_window_s": 2.0},
            ["--router-staleness-ms", "--router-window-s"],
        ),
        ({"instances": 3, "router_queue_weight": 1.0}, ["--router-queue-weight"]),
        (
            {"instances": 3, "router": "session", "router_prefix_weight": 0.0},
            ["--router-prefix-weight"],
        ),
        ({**_POOL, "shared_tier_eviction": "arc"}, ["--shared-tier-eviction"]),
        ({**_POOL, "shared_tier_capacity": "9chunks", "shared_tier_eviction": "arc"}, []),
    ],
)
def test_options_a_fleet_never_reads_are_named(options, unread) -> None:
    from kvsim.options.fleet import FleetOptions

    said = FleetOptions(**options).unread()
    assert [clause.split(" (")[0] for clause in said] == unread


@pytest.mark.parametrize(
    ("options", "timed", "unread"),
    [
        ({**_POOL, "shared_tier_link": "nic-100g"}, False, ["--shared-tier-link"]),
        ({**_POOL, "shared_tier_link": "nic-100g"}, True, []),
        ({"instances": 3, "router_window_s": 2.0}, True, ["--router-window-s"]),
        ({"instances": 3, "router_window_s": 2.0}, False, []),
        ({"router_window_s": 2.0}, True, ["--router-window-s"]),  # named once: one instance
    ],
)
def test_options_one_mode_never_reads_are_named(options, timed, unread) -> None:
    """Cache mode has no time, so no link to time; timed mode routes on the scheduler's
    queues, not on cache mode's window of routed requests."""
    from kvsim.options.fleet import FleetOptions

    said = FleetOptions(**options).unread(timed)
    assert [clause.split(" (")[0] for clause in said] == unread


def test_a_mode_s_unread_option_warns_and_changes_nothing() -> None:
    pool = {"cpu_chunks": 40, "instances": 2, "shared_tier": "pool"}
    plain = kvsim.replay(SAMPLE, **pool).summary
    with pytest.warns(InputWarning, match=r"--shared-tier-link \(cache mode has no time"):
        linked = kvsim.replay(SAMPLE, **pool, shared_tier_link="nic-100g").summary
    assert linked == plain
    fleet = {"cpu_gib": 2, "limit": 60, "instances": 3, "router": "prefix-aware"}
    plain = kvsim.simulate(SAMPLE, **fleet, record_steps=False).summary
    with pytest.warns(InputWarning, match=r"--router-window-s \(cache mode's stand-in"):
        windowed = kvsim.simulate(SAMPLE, **fleet, router_window_s=1.0, record_steps=False)
    assert windowed.summary == plain


@pytest.mark.parametrize("command", [["replay"], ["simulate", "--limit", "5"]])
def test_a_bad_shared_tier_policy_names_the_option(command, capsys) -> None:
    """One line naming the option given, not the secondary tier it becomes."""
    args = [*command, SAMPLE, "--cpu-chunks", "40", "--instances", "2", "--shared-tier", "pool"]
    code, _, err = run_main(
        [*args, "--shared-tier-capacity", "9chunks", "--shared-tier-eviction", "nope"], capsys
    )
    assert code == 2, err
    assert err.startswith("kvsim: error: --shared-tier-eviction: unknown eviction policy 'nope'")
    assert len(err.strip().splitlines()) == 1


def test_unread_fleet_options_warn_once_and_change_nothing(capsys) -> None:
    code, out, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", "40", "--instances", "2", "--json"], capsys
    )
    assert code == 0 and err == ""
    plain = json.loads(out)
    args = ["--router-kv-weight", "7", "--router-queue-weight", "0"]
    code, out, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", "40", "--instances", "2", *args, "--json"], capsys
    )
    assert code == 0
    assert json.loads(out) == plain
    assert err.count("kvsim: warning:") == 1
    assert "--router-queue-weight (only the prefix-aware" in err and "--router-kv-weight (" in err
