"""The benchmark clients' workloads and loads against hand-computed cases: prompt i mod G*P,
the second pass's hits, the spacing of constant and Poisson loads, the closed loop (never
more than N in flight, the next send at the finish) and inference-perf's drained stages."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvsim.core.errors import InputError
from kvsim.engine.engine import Engine
from kvsim.engine.params import EngineParams
from kvsim.engine.transfer_model import DirectionParams, TransferModelParams
from kvsim.options.offload import CacheConfig
from kvsim.specs.hardware import get_gpu
from kvsim.specs.models import get_model
from kvsim.workloads import build_workload

SP = {
    "type": "shared_prefix",
    "num_groups": 2,
    "num_prompts_per_group": 3,
    "system_prompt_len": 40,  # 2 complete 16-token blocks shared by the group
    "question_len": 30,  # 70 tokens: 4 complete blocks, the last 6 tokens partial
    "output_len": 3,
}


def one_second_steps(batch) -> float:
    return 1.0 if batch.tokens else 0.0


def engine(prefix: bool = True, gpu_blocks: int = 256, **params) -> Engine:
    """1 s per step with tokens, synchronous loop: times are whole seconds."""
    d = DirectionParams(0.0, 0.0, ((1.0, 1e9),))
    config = CacheConfig(num_chunks=8, block_tokens=16, chunk_tokens=16, model="llama-3.1-8b")
    ep = EngineParams(
        gpu_blocks=gpu_blocks,
        enable_prefix_caching=prefix,
        max_num_batched_tokens=8192,
        async_scheduling=False,
        **params,
    )
    return Engine(
        config,
        ep,
        model=get_model("llama-3.1-8b"),
        gpu=get_gpu("h200"),
        compute=one_second_steps,
        transfer=TransferModelParams("test", d, d, duplex_factor=1.0),
        offload=False,
    )


def run(workload) -> tuple:
    src = workload.source()
    e = engine().run(src)
    table = e.recorder.request_table().set_index("request").sort_index()
    table["stage"] = [src.stage_of[i] for i in table.index]
    return table, src


def in_flight_peak(table) -> int:
    events = sorted(
        [(t, 1) for t in table.arrival_s] + [(t, -1) for t in table.finish_s],
        key=lambda e: (e[0], e[1]),  # a finish at t frees its slot before a send at t
    )
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


# --- shared prefix ---


def test_shared_prefix_request_i_sends_prompt_i_mod_gp():
    w = build_workload(SP, {"type": "constant", "stages": [{"rate": 1, "duration": 18}]}, seed=3)
    reqs = list(w.trace())
    assert len(reqs) == 18
    for r in reqs:
        assert r.prompt_tokens == 70 and r.output_tokens == 3
        assert len(r.block_hashes) == 4  # complete blocks only
        assert r.block_hashes == reqs[r.request_id % 6].block_hashes  # exact repeats
    first = [r.block_hashes for r in reqs[:6]]
    assert len(set(first)) == 6  # the G*P prompts, each once per pass
    heads = {h[:2] for h in first}
    assert len(heads) == 2  # one system prompt per group
    for head in heads:  # three questions behind each
        assert sum(h[:2] == head for h in first) == 3
    own = [b for h in first for b in h[2:]]
    assert len(set(own)) == len(own) and not set(own) & {b for h in heads for b in h}


def test_shared_prefix_shuffle_is_seeded():
    load = {"type": "constant", "stages": [{"rate": 1, "duration": 6}]}

    def order(seed: int) -> list[tuple[int, ...]]:
        return [r.block_hashes for r in build_workload(SP, load, seed=seed).trace()]

    assert order(5) == order(5)
    assert any(order(s) != order(5) for s in range(6, 12))


def test_second_pass_hits_every_full_block():
    """Requests far apart on a GPU with room: in the first pass a prompt hits its group's
    system prompt blocks once the group has been seen; from the second pass on, every
    complete block (64 of 70 tokens)."""
    w = build_workload(SP, {"type": "constant", "stages": [{"rate": 0.1, "duration": 180}]}, 7)
    table, _ = run(w)
    reqs = list(w.trace())
    seen: set[tuple[int, ...]] = set()
    for r in reqs:
        head = r.block_hashes[:2]
        want = (32 if head in seen else 0) if r.request_id < 6 else 64
        seen.add(head)
        assert table.gpu_hit_tokens[r.request_id] == want, r.request_id


# --- random ---


def test_random_lengths_are_vllms_draws():
    spec = {"type": "random", "input_len": 100, "output_len": 20, "range_ratio": 0.5}
    spec |= {"prefix_len": 40, "num_prompts": 50, "special_tokens": 1}
    w = build_workload(spec, {"type": "constant", "stages": [{"rate": 10, "duration": 5}]}, 0)
    reqs = list(w.trace())
    rng = np.random.default_rng(0)  # vLLM's get_sampling_params, input_len less 1 special
    inputs = rng.integers(49, 149 + 1, size=50)
    outputs = rng.integers(10, 30 + 1, size=50)
    assert [r.prompt_tokens for r in reqs] == list(1 + 40 + inputs)
    assert [r.output_tokens for r in reqs] == list(outputs)
    # the special token and the prefix (41 tokens) share 2 complete blocks; the rest is own
    for r in reqs:
        assert r.block_hashes[:2] == (0, 1)
        assert len(r.block_hashes) == r.prompt_tokens // 16
    own = [b for r in reqs for b in r.block_hashes[2:]]
    assert len(own) == len(set(own))


# --- rate loads ---


def test_constant_is_evenly_spaced_and_stages_back_to_back():
    load = {"type": "constant", "stages": [{"rate": 4, "duration": 2}, {"rate": 2, "duration": 1}]}
    w = build_workload(SP, load)
    assert [r.arrival_s for r in w.trace()] == [i / 4 for i in range(8)] + [2.0, 2.5]
    assert w.stages() == [0] * 8 + [1] * 2
    assert [r.request_id for r in w.trace()] == list(range(10))


def test_poisson_is_seeded_and_inside_its_stage():
    load = {"type": "poisson", "stages": [{"rate": 50, "duration": 10}, {"rate": 5, "duration": 4}]}

    def times(seed: int) -> list[float]:
        return [r.arrival_s for r in build_workload(SP, load, seed=seed).trace()]

    a = times(11)
    assert a == times(11) and a != times(12)
    assert all(x < y for x, y in itertools.pairwise(a))
    stages = build_workload(SP, load, seed=11).stages()
    first = np.array([t for t, s in zip(a, stages) if s == 0])
    second = np.array([t for t, s in zip(a, stages) if s == 1])
    assert first.max() < 10 <= second.min() and second.max() < 14
    assert 400 < len(first) < 600 and 5 <= len(second) <= 40
    gaps = np.diff(first)
    assert abs(gaps.mean() - 1 / 50) < 0.004 and abs(gaps.std() / gaps.mean() - 1) < 0.2


def test_inference_perf_constant_scales_exponential_gaps_to_the_stage():
    load = {"type": "constant", "timing": "inference-perf", "stages": [{"rate": 3, "duration": 4}]}
    a = [r.arrival_s for r in build_workload(SP, load, seed=2).trace()]
    assert len(a) == 12 and a[-1] == pytest.approx(4.0)
    assert all(0 < x < y for x, y in itertools.pairwise(a))
    assert a != [4 * (i + 1) / 12 for i in range(12)]  # not evenly spaced


def test_inference_perf_poisson_counts_per_second():
    load = {"type": "poisson", "timing": "inference-perf", "stages": [{"rate": 20, "duration": 30}]}
    a = np.array([r.arrival_s for r in build_workload(SP, load, seed=4).trace()])
    assert len(a) == 600 and (np.diff(a) > 0).all()
    per_second = np.bincount(np.ceil(a).astype(int) - 1)  # each second ends on a send
    assert per_second.std() > 2  # Poisson counts, not 20 every second


# --- closed loop ---


def test_closed_loop_sends_at_the_finish_and_never_exceeds_n():
    """2 clients, 5 requests of 3 output tokens, 1 s steps: a request takes 3 s, so the
    sends are at 0, 0, 3, 3, 6 and each at the finish of the one it replaces."""
    load = {"type": "concurrency", "stages": [{"concurrency": 2, "num_requests": 5}]}
    table, src = run(build_workload(SP, load))
    assert list(table.arrival_s) == [0, 0, 3, 3, 6]
    assert list(table.finish_s) == [3, 3, 6, 6, 9]
    assert in_flight_peak(table) == 2 and src.done


def test_closed_loop_by_duration_changes_clients_at_the_stage_end():
    """Stage 0: 1 client for 2.5 s; stage 1: 2 clients for 3 s. Request 0 (0 -> 3 s) still
    runs at 2.5 s, where stage 1 sends request 1 with its second slot; request 0's finish
    at 3 s frees the other (request 2); at 6 s stage 1 is over (5.5 s)."""
    load = {
        "type": "concurrency",
        "stages": [{"concurrency": 1, "duration": 2.5}, {"concurrency": 2, "duration": 3}],
    }
    table, _ = run(build_workload(SP, load))
    assert list(table.arrival_s) == [0, 2.5, 3]
    assert list(table.stage) == [0, 1, 1]
    assert in_flight_peak(table) == 2


def test_closed_loop_many_clients_never_exceeds_n():
    load = {"type": "concurrency", "stages": [{"concurrency": 7, "duration": 40}]}
    spec = {"type": "random", "input_len": 200, "output_len": 6, "range_ratio": 0.9}
    table, _ = run(build_workload(spec, load, seed=1))
    assert len(table) > 40
    assert in_flight_peak(table) == 7
    # every send after the first 7 is at some request's finish
    finishes = set(table.finish_s)
    assert all(t in finishes for t in table.arrival_s[7:])


def test_inference_perf_stages_wait_for_the_drain():
    """Stage 1 starts once stage 0's requests have all finished, seen at inference-perf's
    once-a-second check (from 1 s before the stage), plus the 2 s gap."""
    load = {
        "type": "concurrency",
        "timing": "inference-perf",
        "stages": [{"concurrency": 2, "num_requests": 4}, {"concurrency": 3, "num_requests": 3}],
    }
    w = build_workload(SP, load, seed=9)
    table, _ = run(w)
    s0, s1 = table[table.stage == 0], table[table.stage == 1]
    assert len(s0) == 4 and len(s1) == 3
    drained = s0.finish_s.max()
    seen = -1 + np.ceil(drained + 1)  # checks at -1, 0, 1, ... s
    assert s1.arrival_s.min() >= seen + 2.0
    assert s1.arrival_s.max() <= seen + 2.0 + 1.0  # queued over its first second
    assert in_flight_peak(s0) == 2 and in_flight_peak(table) <= 3


def test_open_trace_of_a_closed_load_is_refused():
    w = build_workload(SP, {"type": "concurrency", "stages": [{"concurrency": 2, "duration": 5}]})
    with pytest.raises(InputError, match="no fixed arrival times"):
        w.trace()


@pytest.mark.parametrize(
    ("workload", "load", "match"),
    [
        ({**SP, "type": "shared"}, None, "did you mean 'shared_prefix'"),
        ({**SP, "num_groups": 0}, None, "num_groups"),
        ({**SP, "ignore_eos": False}, None, "ignore_eos"),
        # a length past any model's context: it was an OverflowError or a MemoryError
        ({**SP, "system_prompt_len": 10**30}, None, "system_prompt_len: Expected `int` <= 1000"),
        ({**SP, "question_len": 10**11}, None, "question_len: Expected `int` <= 100000000"),
        ({"type": "random", "input_len": 10**12}, None, "input_len: Expected `int` <= 1000"),
        ({"type": "random", "prefix_len": 10**12}, None, "prefix_len: Expected `int` <= 1000"),
        (SP, {"type": "constant", "stages": [{"concurrency": 2, "duration": 1}]}, "stages"),
        (SP, {"type": "concurrency", "stages": [{"concurrency": 2}]}, "duration or num_requests"),
        (SP, {"type": "poisson", "stages": [{"rate": 1, "duraton": 1}]}, "duraton: unknown key"),
        (
            SP,
            {
                "type": "concurrency",
                "timing": "inference-perf",
                "stages": [{"concurrency": 2, "duration": 5}],
            },
            "counts num_requests",
        ),
    ],
)
def test_bad_specs_are_one_line_errors(workload, load, match):
    load = load or {"type": "constant", "stages": [{"rate": 1, "duration": 1}]}
    with pytest.raises(InputError, match=match) as err:
        build_workload(workload, load)
    assert "\n" not in str(err.value)


# --- per-stage metrics ---


def test_stage_table_by_hand():
    """Alone on 1 s steps, a request of 3 output tokens has TTFT 1 s, E2E 3 s and ITLs of
    1 s. Stage 0 sends at 0 and 10 s (done at 13 s), stage 1 at 20 and 21 s (at 24 s)."""
    from kvsim.engine.stage_report import stage_table
    from kvsim.report.serve_metrics import BenchSettings

    load = {
        "type": "constant",
        "stages": [{"rate": 0.1, "duration": 20}, {"rate": 1, "duration": 2}],
    }
    w = build_workload(SP, load)
    src = w.source()
    e = engine().run(src)
    requests = e.recorder.request_table()
    table = stage_table(requests, e.recorder, src.stage_of, BenchSettings()).set_index("stage")
    assert list(table.index) == [0, 1, "all"]
    assert list(table.requests) == [2, 2, 4]
    assert list(table.start_s) == [0, 20, 0] and list(table.end_s) == [13, 24, 24]
    assert table.request_throughput.tolist() == pytest.approx([2 / 13, 2 / 4, 4 / 24])
    assert table.output_throughput.tolist() == pytest.approx([6 / 13, 6 / 4, 12 / 24])
    for col, ms in (("mean_ttft_ms", 1000), ("p90_ttft_ms", 1000), ("mean_e2el_ms", 3000)):
        assert table[col].tolist() == pytest.approx([ms] * 3)
    assert table.mean_itl_ms.tolist() == pytest.approx([1000] * 3)
