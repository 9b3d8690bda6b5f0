"""Secondary tiers behind the CPU tier (vLLM 0.33's ``TieringOffloadingSpec``), without vLLM:
golden scenarios worked out by hand, the manager's failure and back-pressure paths, the
tier specifications (vLLM's JSON and ``--tier``), and the CLI.

The hand-worked cases follow vLLM's LRU: a running request's chunks are ranked tail
older than head, and at its finish its keys are committed tail first, so its head ends
most recent. ``tests/vllm/test_vllm_tiering_differential.py`` checks the manager against
vLLM's own, step by step.
"""

from __future__ import annotations

import json

import pytest
from support import SAMPLE, run_main

from kvsim.cachemode import REQUEST_COLUMNS, CacheReplay
from kvsim.core.errors import InputError
from kvsim.manager.offload import LookupResult
from kvsim.options.offload import OffloadOptions
from kvsim.options.tiers import (
    BackpressureSpec,
    TierSpec,
    as_tier_specs,
    parse_byte_size,
    tier_from_shorthand,
)
from kvsim.options.vllm import options_from_vllm_config
from kvsim.policies.lru import LRUPolicy
from kvsim.tiering.backpressure import EMADetector
from kvsim.tiering.manager import TieredManager
from kvsim.tiering.metrics import (
    BACKPRESSURE_BLOCKS_DROPPED,
    BACKPRESSURE_STORES_DROPPED,
    CASCADE_JOB_FAILURES,
    CHUNK_HITS,
    CHUNK_QUERIES,
    PROMOTION_JOB_FAILURES,
    READ_BYTES,
)
from kvsim.tiering.primary import PrimaryTier
from kvsim.tiering.secondary import SecondaryTier
from kvsim.tiering.store import UnboundedStore
from kvsim.traces import Request

TIERING = "TieringOffloadingSpec"
H, P, M, R = LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS, LookupResult.RETRY


def _req(i: int, hashes: list[int]) -> Request:
    return Request(i, float(i), 16 * len(hashes), 1, tuple(hashes))


def _replay(requests, tiers, **opts):
    extra = {"spec_name": TIERING, "secondary_tiers": tiers}
    options = {"cpu_chunks": 2, "model": None, **opts}
    cfg = options_from_vllm_config(extra, OffloadOptions(**options)).with_(chunk_tokens=16)
    run = CacheReplay(cfg.resolve(16))
    rows: list[tuple] = []
    summary = run.run(requests, rows.append)
    return run, summary, [dict(zip(REQUEST_COLUMNS, r)) for r in rows]


# --- golden scenarios (cache mode) ---

#: req 2 finds its first two chunks only in the tier; req 3's first promotion evicts its own
#: second chunk from the CPU tier (vLLM's LRU), so both come from the tier; req 4 hits the CPU
PROMOTION_TRACE = [
    _req(0, [1, 2]),
    _req(1, [3, 4]),
    _req(2, [1, 2, 5]),
    _req(3, [2, 5]),
    _req(4, [2, 5]),
]


def test_a_cpu_miss_is_promoted_from_the_tier_and_attributed_to_it():
    run, s, rows = _replay(PROMOTION_TRACE, [{"type": "example"}])
    assert [r["cpu_hit_blocks"] for r in rows] == [0, 0, 2, 2, 2]
    assert s["cpu_hit_blocks"] == 6  # every block loaded through the CPU tier
    assert (s["cpu_tier_hit_blocks"], s["tier1_example_hit_blocks"]) == (2, 4)
    assert s["tier1_example_hit_ratio"] == pytest.approx(4 / 11)
    assert s["combined_hit_ratio"] == pytest.approx(6 / 11)
    assert s["tier1_example_promoted_chunks"] == 4
    assert s["tier1_example_cascaded_chunks"] == 5  # 1, 2, 3, 4 and 5, each once
    assert s["tier1_example_resident_chunks"] == 5
    assert s["tier1_example_capacity_chunks"] is None
    assert s["tier1_example_eviction"].startswith("none")
    # the example tier answers at once: req 2 and req 3 wait one step for their promotions
    assert (s["requests_waited"], s["lookup_steps_waited"], s["requests_stalled"]) == (2, 2, 0)
    assert run.tier.resident_keys() == [5, 2]


def test_an_fs_tier_answers_existence_checks_a_step_later():
    _, s, rows = _replay(PROMOTION_TRACE, [{"type": "fs"}])
    assert [r["cpu_hit_blocks"] for r in rows] == [0, 0, 2, 2, 2]
    assert (s["cpu_tier_hit_blocks"], s["tier1_fs_hit_blocks"]) == (2, 4)
    # req 0, 1: one step for the check; req 2: check, promotion; req 3: check of 2,
    # promotion of 2 (evicting 5) with the check of 5, promotion of 5; req 4: none
    assert (s["requests_waited"], s["lookup_steps_waited"]) == (4, 7)


def test_without_tiers_the_same_trace_hits_only_what_the_cpu_tier_kept():
    cfg = OffloadOptions(cpu_chunks=2, model=None).resolve(16)
    rows: list[tuple] = []
    s = CacheReplay(cfg, fused=False).run(PROMOTION_TRACE, rows.append)
    assert [r[REQUEST_COLUMNS.index("cpu_hit_blocks")] for r in rows] == [0, 0, 0, 0, 2]
    assert "secondary_tiers" not in s and s["tier"] == "protocol"


def test_a_bounded_tier_evicts_and_loses_the_hits_an_unbounded_one_keeps():
    trace = [_req(0, [1]), _req(1, [2]), _req(2, [3]), _req(3, [1]), _req(4, [2])]
    _, unbounded, _ = _replay(trace, [{"type": "example"}], cpu_chunks=1)
    assert unbounded["tier1_example_hit_blocks"] == 2
    _, bounded, _ = _replay(trace, [{"type": "example", "kvsim_capacity_chunks": 2}], cpu_chunks=1)
    # writes 1, 2, 3 (evicts 1), 1 (evicts 2), 2 (evicts 3): requests 3 and 4 miss everywhere
    assert bounded["tier1_example_hit_blocks"] == 0 and bounded["cpu_hit_blocks"] == 0
    assert bounded["tier1_example_evicted_chunks"] == 3
    assert bounded["tier1_example_resident_chunks"] == 2
    assert bounded["tier1_example_capacity_chunks"] == 2
    assert "beyond vLLM" in bounded["tier1_example_eviction"]
    assert "beyond vLLM" in bounded["secondary_tiers"]


def test_promotions_into_a_cpu_tier_smaller_than_the_prompt_stall():
    """CPU tier of one chunk, prompt of two, both on the tier: each step's promotion evicts
    the other chunk (or finds no room), so the scan never settles; kvsim stops after
    MAX_LOOKUP_STEPS and runs the request without a load."""
    trace = [_req(0, [1, 2]), _req(1, [1, 2])]
    _, s, rows = _replay(trace, [{"type": "example"}], cpu_chunks=1, prefill_chunk_tokens=16)
    assert s["requests_stalled"] == 1 and s["lookup_steps_waited"] == 16
    assert s["promotion_allocation_failures"] == 8  # every other step: no room for chunk 2
    assert rows[1]["cpu_hit_blocks"] == 0


def test_a_tier_that_never_hits_changes_nothing_and_receives_every_stored_chunk():
    options = dict(cpu_chunks=100_000, model=None)
    plain = CacheReplay(OffloadOptions(**options).resolve(512), fused=False)
    base = plain.run(_sample())
    extra = {"spec_name": TIERING, "secondary_tiers": [{"type": "fs"}], "block_size": 512}
    tiered = CacheReplay(options_from_vllm_config(extra, OffloadOptions(**options)).resolve(512))
    s = tiered.run(_sample())
    assert s["cpu_hit_blocks"] == base["cpu_hit_blocks"] == s["cpu_tier_hit_blocks"] > 0
    assert s["tier1_fs_hit_blocks"] == 0
    assert s["tier1_fs_cascaded_chunks"] == s["chunks_stored"] == base["chunks_stored"]


def _sample():
    from kvsim.traces import open_trace

    return list(open_trace(SAMPLE))


# --- the manager's failure and back-pressure paths, with jobs finished by hand ---


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _manager(kind: str = "example", bp: BackpressureSpec | None = None, cpu: int = 4):
    clock = Clock()
    tier = SecondaryTier(
        TierSpec(type=kind, backpressure=bp),
        0,
        UnboundedStore(),
        None if bp is None else EMADetector(bp, clock),
        instant=False,
    )
    manager = TieredManager(
        PrimaryTier(cpu, LRUPolicy(cpu)), [tier], chunk_bytes=1 << 20, clock=clock
    )
    return manager, tier, clock


def _store(manager: TieredManager, req_id: str, keys: list[int]):
    """A request that stores ``keys`` and finishes; its cascade jobs stay in flight."""
    ctx = manager.new_context(req_id, {k: 16 * (i + 1) for i, k in enumerate(keys)})
    manager.on_new_request(ctx)
    out = manager.prepare_store(keys, ctx)
    manager.complete_store(out.keys_to_store, ctx)
    manager.on_schedule_end([req_id])
    manager.on_request_finished(ctx)
    return ctx


def _fill_tier_then_empty_cpu(manager, tier, keys):
    _store(manager, "w", keys)
    for job in tier.in_flight:
        tier.finish(job.job_id)
    manager.reset_cache()  # the CPU tier empties, the tier keeps its chunks
    manager.on_reset_flushed()


def test_a_failed_promotion_frees_its_slot_and_a_failed_load_marks_the_key_missing():
    manager, tier, _ = _manager("fs")
    _fill_tier_then_empty_cpu(manager, tier, [7])
    ctx = manager.new_context("r", {7: 16})
    manager.on_new_request(ctx)
    assert manager.lookup(7, ctx) is R  # the existence check goes out at the step's end
    manager.on_schedule_end()
    tier.lookups.answer()
    assert manager.lookup(7, ctx) is P  # promoted: a pending CPU write
    assert manager.primary.lookup(7) is P
    manager.on_schedule_end()
    (job,) = tier.in_flight
    assert job.is_promotion and job.keys == [7]
    tier.finish(job.job_id, ok=False)
    assert manager.lookup(7, ctx) is M  # slot freed; the failed load made the verdict "absent"
    assert manager.primary.num_resident == 0
    counters, _ = manager.take_stats()
    assert counters[(PROMOTION_JOB_FAILURES, "1:fs")] == 1
    assert tier.counters.promotion_failures == 1 and tier.counters.promoted_chunks == 0


def test_a_partly_failed_promotion_keeps_the_chunks_that_arrived():
    manager, tier, _ = _manager("example")
    _fill_tier_then_empty_cpu(manager, tier, [1, 2, 3])
    ctx = manager.new_context("r", {1: 16, 2: 32, 3: 48})
    manager.on_new_request(ctx)
    assert [manager.lookup(k, ctx) for k in (1, 2, 3)] == [P, P, P]
    manager.on_schedule_end()
    (job,) = tier.in_flight  # one job per tier and request per step
    assert job.keys == [1, 2, 3]
    tier.finish(job.job_id, ok=False, keep=1)
    assert manager.lookup(1, ctx) is H
    assert [manager.primary.lookup(k) for k in (2, 3)] == [M, M]
    counters, _ = manager.take_stats()
    assert counters[(READ_BYTES, "1:example")] == 1 << 20
    assert manager.load_source(1, ctx) == 1


def test_a_failed_cascade_unpins_and_leaves_the_tier_without_the_chunk():
    manager, tier, _ = _manager("example")
    _store(manager, "w", [5])
    assert manager.primary.num_evictable == 0  # pinned by the running cascade
    (job,) = tier.in_flight
    tier.finish(job.job_id, ok=False)
    manager.on_schedule_end()
    assert manager.primary.num_evictable == 1
    assert not tier.store.contains(5)
    counters, _ = manager.take_stats()
    assert counters[(CASCADE_JOB_FAILURES, "1:example")] == 1


def test_back_pressure_drops_cascades_once_stores_are_slow():
    bp = BackpressureSpec(
        policy="DropStorePolicy",
        high_water_s=0.5,
        low_water_s=0.1,
        alpha=1.0,
        warmup_completions=1,
        decay_half_life_s=0.0,
        cooldown_s=0.0,
    )
    manager, tier, clock = _manager("fs", bp)
    for i, key in enumerate((1, 2)):  # each one-chunk (1 MiB) store takes 2 s
        _store(manager, f"w{i}", [key])
        clock.now += 2.0
        (job,) = tier.in_flight
        tier.finish(job.job_id)
        manager.on_schedule_end()
    assert tier.detector.ema == 2.0 and tier.detector.is_under_pressure()
    _store(manager, "w2", [3, 4])
    assert tier.in_flight == []  # dropped, not submitted
    assert (tier.counters.dropped_stores, tier.counters.dropped_chunks) == (1, 2)
    counters, _ = manager.take_stats()
    assert counters[(BACKPRESSURE_STORES_DROPPED, "1:fs")] == 1
    assert counters[(BACKPRESSURE_BLOCKS_DROPPED, "1:fs")] == 2
    assert manager.primary.lookup(3) is H and not tier.store.contains(3)


def test_lookups_count_once_per_request_and_tier():
    manager, tier, _ = _manager("example")
    _fill_tier_then_empty_cpu(manager, tier, [1])
    ctx = manager.new_context("r", {1: 16})
    manager.on_new_request(ctx)
    manager.lookup(1, ctx)  # CPU miss, tier hit (promotion)
    manager.on_schedule_end()
    for job in tier.in_flight:
        tier.finish(job.job_id)
    assert manager.lookup(1, ctx) is H  # now a CPU hit, but the CPU tier already answered
    counters, _ = manager.take_stats()  # the request's first answer, MISS, was the one counted
    assert counters[(CHUNK_QUERIES, "1:example")] == counters[(CHUNK_HITS, "1:example")] == 1
    assert counters[(CHUNK_QUERIES, "0:primary")] == 1
    assert (CHUNK_HITS, "0:primary") not in counters


# --- specifications ---


def test_vllms_secondary_tiers_json_is_read_as_is():
    extra = {
        "spec_name": TIERING,
        "cpu_bytes_to_use": 10 << 30,
        "tier_poll_interval_s": 0.001,
        "backpressure": {"backpressure_cls": "EMABackpressureDetector", "alpha": 0.3},
        "secondary_tiers": [
            {"type": "fs", "root_dir": "/mnt/nvme/kv", "n_read_threads": 8},
            {
                "type": "fs",
                "root_dir": "/mnt/ceph",
                "locality": "REMOTE",
                "backpressure": {"policy_cls": "DropStorePolicy", "high_water_s": 0.2},
            },
            {"type": "example", "custom_param": 67},
        ],
    }
    nvme, ceph, example = options_from_vllm_config(extra).secondary_tiers
    assert nvme.backpressure == BackpressureSpec(alpha=0.3, failure_threshold=3)
    assert ceph.backpressure == BackpressureSpec(
        policy="DropStorePolicy",
        alpha=0.3,
        high_water_s=0.2,
        low_water_s=0.010,
        failure_threshold=3,
    )
    assert example.backpressure == BackpressureSpec(alpha=0.3)  # no failure trip for example
    assert nvme.async_lookup and not example.async_lookup
    assert not nvme.bounded


def test_a_tier_without_back_pressure_config_has_no_detector():
    extra = {"spec_name": TIERING, "secondary_tiers": [{"type": "obj"}]}
    (tier,) = options_from_vllm_config(extra).secondary_tiers
    assert tier.backpressure is None
    (tier,) = options_from_vllm_config(
        {
            "spec_name": TIERING,
            "secondary_tiers": [
                {"type": "obj", "backpressure": {"backpressure_cls": "EMABackpressureDetector"}}
            ],
        }
    ).secondary_tiers
    assert (tier.backpressure.high_water_s, tier.backpressure.low_water_s) == (0.050, 0.010)


def test_the_shorthand_is_vllms_tier_object():
    assert tier_from_shorthand("fs") == {"type": "fs"}
    assert tier_from_shorthand("fs:capacity=2TiB,policy=arc,locality=REMOTE") == {
        "type": "fs",
        "kvsim_capacity": "2TiB",
        "kvsim_eviction_policy": "arc",
        "locality": "REMOTE",
    }
    assert tier_from_shorthand("example:chunks=100") == {
        "type": "example",
        "kvsim_capacity_chunks": 100,
    }
    (tier,) = as_tier_specs([tier_from_shorthand("fs:capacity=2TiB")])
    assert tier.capacity_bytes == 2 << 40 and tier.eviction_policy == "lru"
    assert OffloadOptions(secondary_tiers=[{"type": "fs"}]).secondary_tiers == (TierSpec("fs"),)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2TiB", 2 << 40),
        ("500GB", 500 * 10**9),
        ("1.5 GiB", 3 << 29),
        (4096, 4096),
        ("1e12", 10**12),
    ],
)
def test_byte_sizes(text, size):
    assert parse_byte_size(text, "x") == size


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"secondary_tiers": [{"type": "fs"}]}, "needs spec_name"),
        (
            {"spec_name": TIERING, "secondary_tiers": {"type": "fs"}},
            "secondary_tiers: Expected `array`",
        ),
        (
            {"spec_name": TIERING, "secondary_tiers": [{"root_dir": "/x"}]},
            "secondary_tiers[0].type: missing (a required key)",
        ),
        (
            {"spec_name": TIERING, "secondary_tiers": [{"type": "nvme"}]},
            "secondary_tiers[0].type: must be one of fs, obj, example, got 'nvme'",
        ),
        ({"spec_name": TIERING, "secondary_tiers": [{"type": "p2p"}]}, "peer vLLM instances"),
        (
            {"spec_name": TIERING, "secondary_tiers": [{"type": "X", "module_path": "m"}]},
            "out-of-tree",
        ),
        (
            {"spec_name": TIERING, "secondary_tiers": [{"type": "fs", "rootdir": "/x"}]},
            "secondary_tiers[0].rootdir: unknown key (did you mean 'root_dir'?)",
        ),
        (
            {"spec_name": TIERING, "secondary_tiers": [{"type": "fs", "locality": "local"}]},
            "locality: must be one of LOCAL, REMOTE, got 'local'",
        ),
        (
            {"spec_name": TIERING, "secondary_tiers": [{"type": "fs", "backpressure": {}}]},
            "backpressure_cls",
        ),
        (
            {
                "spec_name": TIERING,
                "secondary_tiers": [{"type": "fs", "backpressure": {"backpressure_cls": "Other"}}],
            },
            "backpressure.backpressure_cls: must be one of EMABackpressureDetector,",
        ),
        (
            {
                "spec_name": TIERING,
                "backpressure": {"backpressure_cls": "EMABackpressureDetector", "alpha": 2},
                "secondary_tiers": [{"type": "fs"}],
            },
            "backpressure.alpha: Expected `float` <= 1.0, got 2",
        ),
        (
            {
                "spec_name": TIERING,
                "secondary_tiers": [{"type": "fs", "kvsim_eviction_policy": "arc"}],
            },
            "needs a capacity",
        ),
        (
            {"spec_name": TIERING, "secondary_tiers": [{"type": "fs", "kvsim_capacity": "2XB"}]},
            "unknown unit",
        ),
        (
            {"spec_name": TIERING, "store_threshold": 2, "secondary_tiers": []},
            "store_threshold is not supported",
        ),
    ],
)
def test_bad_tier_configs_are_one_line_errors(extra, message):
    with pytest.raises(InputError, match=None) as exc:
        options_from_vllm_config(extra)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_tiers_refuse_admission_rules_and_both_modes_take_them():
    extra = {"spec_name": TIERING, "secondary_tiers": [{"type": "fs"}]}
    with pytest.raises(InputError, match="admit every chunk"):
        options_from_vllm_config(
            extra, OffloadOptions(cpu_chunks=4, model=None, admission="s3fifo")
        ).resolve(16)
    from kvsim.options.vllm import (
        engine_knobs_from_vllm_config,
        refuse_engine_knobs_in_cache_mode,
    )

    assert engine_knobs_from_vllm_config(extra) == {}  # the timed engine takes them
    refuse_engine_knobs_in_cache_mode(extra)  # cache mode takes them


# --- the command line ---


def test_cli_tier_shorthand_and_vllm_json_give_the_same_run(tmp_path, capsys):
    args = ["replay", SAMPLE, "--cpu-chunks", 64, "--model", "llama-3.1-8b", "--json"]
    code, out, err = run_main([*args, "--tier", "fs:capacity=256GiB,policy=arc"], capsys)
    assert code == 0, err
    short = json.loads(out)
    config = tmp_path / "kv.json"
    config.write_text(
        json.dumps(
            {
                "kv_connector": "OffloadingConnector",
                "kv_connector_extra_config": {
                    "spec_name": TIERING,
                    "block_size": 512,
                    "secondary_tiers": [
                        {"type": "fs", "kvsim_capacity": "256GiB", "kvsim_eviction_policy": "arc"}
                    ],
                },
            }
        )
    )
    code, out, err = run_main([*args, "--vllm-config", config], capsys)
    assert code == 0, err
    assert json.loads(out) == {**short, "trace": short["trace"]}
    assert short["tier"] == "tiered" and short["secondary_tiers"].startswith("1:fs (")
    assert short["tier1_fs_capacity_chunks"] == (256 << 30) // short["chunk_bytes"]
    assert short["tier1_fs_cascaded_chunks"] == short["chunks_stored"]  # nothing evicted yet


def test_cli_without_tier_is_unchanged(capsys):
    args = ["replay", SAMPLE, "--cpu-chunks", 64, "--model", "llama-3.1-8b", "--json"]
    code, out, _ = run_main(args, capsys)
    assert code == 0
    plain = json.loads(out)
    assert "secondary_tiers" not in plain and plain["tier"] != "tiered"


@pytest.mark.parametrize(
    ("tier", "message"),
    [
        ("nvme", "type: must be one of fs, obj, example, got 'nvme'"),
        ("fs:capcity=2TiB", "unknown key 'capcity' (did you mean 'capacity'?)"),
        ("fs:capacity=2XB", "unknown unit"),
        ("fs:capacity", "expected KEY=VALUE"),
        ("p2p", "peer vLLM instances"),
        ("fs:policy=arc", "needs a capacity"),
        ("fs:capacity=2TiB,policy=nosuch", "unknown eviction policy 'nosuch'"),
        (":capacity=1", "expected TYPE"),
    ],
)
def test_cli_bad_tier_is_one_line_and_exit_2(tier, message, capsys):
    code, _, err = run_main(["replay", SAMPLE, "--cpu-chunks", 64, "--tier", tier], capsys)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_tier_replaces_the_configs_tiers_and_conflicts_are_errors(capsys, tmp_path):
    config = tmp_path / "kv.json"
    config.write_text(
        json.dumps(
            {
                "spec_name": TIERING,
                "cpu_bytes_to_use": 1 << 30,
                "secondary_tiers": [{"type": "example"}],
            }
        )
    )
    code, out, err = run_main(["replay", SAMPLE, "--vllm-config", config, "--json"], capsys)
    assert code == 0 and json.loads(out)["secondary_tiers"] == "1:example", err
    code, out, err = run_main(
        ["replay", SAMPLE, "--vllm-config", config, "--tier", "fs", "--json"], capsys
    )
    assert code == 0 and json.loads(out)["secondary_tiers"] == "1:fs", err
    code, _, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", 8, "--tier", "fs", "--store-threshold", 2], capsys
    )
    assert code == 2 and "admit every chunk" in err
    code, _, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", 8, "--tier", "fs", "--protocol", "object"], capsys
    )
    assert code == 2 and "--protocol prefix" in err


def test_the_python_api_takes_tiers_in_both_modes():
    import kvsim

    result = kvsim.replay(SAMPLE, cpu_chunks=64, limit=20, secondary_tiers=[{"type": "fs"}])
    assert result.summary["secondary_tiers"] == "1:fs" and result.summary["requests"] == 20
    assert result.config["secondary_tiers"][0]["type"] == "fs"
    timed = kvsim.simulate(SAMPLE, cpu_chunks=64, limit=5, secondary_tiers=[{"type": "fs"}])
    assert timed.summary["tier1_fs_device"] == "nvme-gen4"  # tests/engine/test_timed_tiers.py
