"""Cache-mode replay on the bundled 200-request Mooncake sample, checked against
expectations computed independently from the raw JSON lines."""

from __future__ import annotations

import json
import os

import pytest

from kvsim.api import replay
from kvsim.cachemode.driver import PART_ROWS

TRACE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "traces",
    "samples",
    "mooncake_small.jsonl",
)
BLOCK = 512


@pytest.fixture(scope="module")
def raw():
    with open(TRACE) as f:
        return [json.loads(line) for line in f if line.strip()]


def complete_ids(rec):
    return rec["hash_ids"][: rec["input_length"] // BLOCK]


def leading_seen(ids, seen):
    n = 0
    for i in ids:
        if i not in seen:
            break
        n += 1
    return n


@pytest.fixture(scope="module")
def huge(raw):
    return replay(TRACE, cpu_chunks=100_000)


def test_conservation(raw, huge):
    s, rows = huge.summary, huge.requests
    assert s["requests"] == len(raw) == len(rows)
    assert (
        s["prompt_blocks"] == sum(len(complete_ids(r)) for r in raw) == rows["prompt_blocks"].sum()
    )
    assert s["prompt_tokens"] == sum(r["input_length"] for r in raw)
    assert (rows["gpu_hit_blocks"] + rows["cpu_hit_blocks"] <= rows["prompt_blocks"]).all()
    assert s["cpu_hit_blocks"] == rows["cpu_hit_blocks"].sum()
    assert s["chunks_stored"] == rows["stored_blocks"].sum()


def test_huge_cache_hits_every_repeated_block(raw, huge):
    seen: set = set()
    expected_hits, expected_stores = [], []
    for rec in raw:
        ids = complete_ids(rec)
        expected_hits.append(leading_seen(ids, seen))
        expected_stores.append(len([i for i in ids if i not in seen]))
        seen.update(ids)
    rows = huge.requests
    assert rows["cpu_hit_blocks"].tolist() == expected_hits
    assert rows["stored_blocks"].tolist() == expected_stores
    assert huge.summary["chunks_evicted"] == 0 and sum(expected_hits) > 100


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_cpu_hits_only_for_previously_stored_chunks(raw, policy):
    res = replay(TRACE, cpu_chunks=40, policy=policy)
    stored: set = set()
    for rec, (_, row) in zip(raw, res.requests.iterrows()):
        ids = complete_ids(rec)
        assert row["cpu_hit_blocks"] <= leading_seen(ids, stored)
        stored.update(ids)  # every complete block is offered: an upper bound on what is stored
    assert res.summary["chunks_evicted"] > 0  # the capacity really binds
    assert res.summary["cpu_resident_chunks"] <= 40


def test_gpu_cache_reduces_cpu_loads():
    without = replay(TRACE, cpu_chunks=2000).summary
    with_gpu = replay(TRACE, cpu_chunks=2000, gpu_blocks=300).summary
    assert with_gpu["gpu_hit_blocks"] > 0 and without["gpu_hit_blocks"] == 0
    assert with_gpu["cpu_hit_blocks"] < without["cpu_hit_blocks"]


def test_store_threshold_two_stores_fewer():
    plain = replay(TRACE, cpu_chunks=2000).summary
    filtered = replay(TRACE, cpu_chunks=2000, store_threshold=2).summary
    assert filtered["chunks_stored"] < plain["chunks_stored"]
    assert filtered["chunks_skipped_by_threshold"] > 0 and plain["chunks_skipped_by_threshold"] == 0


def test_replay_is_deterministic():
    a = replay(TRACE, cpu_chunks=50, policy="arc", gpu_blocks=100)
    b = replay(TRACE, cpu_chunks=50, policy="arc", gpu_blocks=100)
    assert a.summary == b.summary and a.requests.equals(b.requests)


@pytest.mark.parametrize("gpu_blocks", [0, 40])  # the fused whole-run loop, the general one
def test_progress_hears_every_part_and_changes_no_row(gpu_blocks):
    heard: list[int] = []
    quiet = replay(TRACE, cpu_chunks=60, gpu_blocks=gpu_blocks)
    told = replay(TRACE, cpu_chunks=60, gpu_blocks=gpu_blocks, progress=heard.append)
    assert sum(heard) == 200 and heard[:-1] == [PART_ROWS] * (len(heard) - 1)
    assert told.requests.equals(quiet.requests)
