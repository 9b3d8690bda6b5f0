"""A cut stage's unmeasured warm-up (``shortened``): which stages run, which stand for a
measured stage, and that ``accuracy`` reports the measured part under the stage's own
index."""

from __future__ import annotations

import pytest
from measurements_small import experiment, write
from support import run_main

from kvsim.accuracy.measurements import Experiment
from kvsim.accuracy.report import accuracy
from kvsim.accuracy.run import shortened
from kvsim.options.schema import load


def _exp(stages: list[dict], kind: str = "constant") -> Experiment:
    return load(Experiment, experiment(load={"type": kind, "stages": stages}), source="test")


def _shape(exp: Experiment) -> list[tuple[float | None, int | None]]:
    return [(st.duration, st.num_requests) for st in exp.load.stages]


def test_long_stages_get_a_warm_up_and_short_ones_are_only_cut():
    exp = _exp(
        [{"rate": 8, "duration": 600}, {"rate": 20, "duration": 45}, {"rate": 2, "duration": 9}]
    )
    run, measured = shortened(exp, 20, 30)
    # 600 > 30 + 20: warm-up then the cut; 45 <= 50: cut only; 9 <= 20: as it was
    assert _shape(run) == [(30, None), (20, None), (20, None), (9, None)]
    assert [st.rate for st in run.load.stages] == [8, 8, 20, 2]
    assert measured == [None, 0, 1, 2]


def test_no_warm_up_without_a_cut_or_at_zero():
    exp = _exp([{"rate": 8, "duration": 600}])
    run, measured = shortened(exp, None, 30)
    assert run is exp and measured == [0]
    run, measured = shortened(exp, 20, 0)
    assert _shape(run) == [(20, None)] and measured == [0]


def test_a_closed_loop_by_requests_is_cut_by_requests_without_a_warm_up():
    exp = _exp(
        [{"concurrency": 4, "num_requests": 1000}, {"concurrency": 2, "duration": 100}],
        kind="concurrency",
    )
    run, measured = shortened(exp, 20, 30)
    assert _shape(run) == [(None, 80), (30, None), (20, None)]
    assert measured == [0, None, 1]


@pytest.mark.parametrize("warmup", [0.0, 4.0])
def test_accuracy_reports_the_measured_part_under_the_stage_index(tmp_path, warmup):
    """Stages of 10 s cut to 3: with a 4-s warm-up the run sends 2 x 7 s of requests, and
    the rows are still stage 0, stage 1 and all."""
    path = write(
        tmp_path / "m.yaml",
        experiment(
            load={"type": "constant", "stages": [{"rate": 4, "duration": 10} for _ in "01"]}
        ),
    )
    report = accuracy(path, max_stage_s=3, warmup_s=warmup)
    (result,) = report.results
    assert result.error is None
    assert sorted({row.stage for row in report.rows}) == ["0", "1", "all"]
    assert result.requests == 2 * 4 * (3 + warmup)
    assert report.config["warmup_s"] == warmup


def test_warmup_without_a_cut_is_one_line(tmp_path, capsys):
    code, _, err = run_main(["accuracy", write(tmp_path / "m.yaml"), "--warmup-s", "5"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--warmup-s" in err and "--max-stage-s" in err


def test_the_whole_run_weighs_each_request_by_the_time_it_stands_for():
    """A 10-s stage cut to 3 after a 4-s warm-up: a warm-up request is its own 4 s, a
    measured one stands for (10 - 4) / 3 = 2 of the stage's; throughputs over 4 + 2 x 3 s
    and the last stage's drain (0.5 s)."""
    import pandas as pd

    from kvsim.accuracy.whole_run import stage_weights, weighted_whole_run

    exp = _exp([{"rate": 1, "duration": 10}])
    run, measured = shortened(exp, 3, 4)
    weights = stage_weights(exp, run, measured)
    assert weights == [1.0, 2.0]
    requests = pd.DataFrame(
        {
            "stage": [0, 0, 1, 1],
            "rejected": [False] * 4,
            "ttft_s": [0.1, 0.1, 0.01, 0.01],
            "e2e_s": [1.0, 1.0, 0.5, 0.5],
        }
    )
    rows = [
        {"stage": s, "duration": d, "total_input_tokens": 100, "total_output_tokens": 10}
        for s, d in ((0, 4.5), (1, 3.5), ("all", 8.0))
    ]
    stages = pd.DataFrame(rows)
    whole = weighted_whole_run(stages, requests, run, weights).iloc[-1]
    assert whole["stage"] == "all" and whole["completed"] == 6
    assert whole["duration"] == pytest.approx(4 + 2 * 3 + 0.5)
    assert whole["total_input_tokens"] == 300 and whole["total_output_tokens"] == 30
    assert whole["mean_ttft_ms"] == pytest.approx((2 * 100 + 4 * 10) / 6)
    assert whole["mean_e2el_ms"] == pytest.approx((2 * 1000 + 4 * 500) / 6)
    assert whole["p90_ttft_ms"] == pytest.approx(100) and whole["p99_e2el_ms"] == 1000
    uncut = [1.0, 1.0]
    assert weighted_whole_run(stages, requests, run, uncut) is stages


def test_a_cut_runs_whole_run_rate_is_the_real_runs(tmp_path):
    """Ten minutes at 4/s cut to 3 s after a 4-s warm-up: all's request rate is the real
    run's 4/s (its requests over its 600 s), not 28 requests over 7 s less a gap."""
    load_ = {"type": "constant", "stages": [{"rate": 4, "duration": 600}]}
    report = accuracy(write(tmp_path / "m.yaml", experiment(load=load_)), max_stage_s=3, warmup_s=4)
    rows = {(row.stage, row.metric): row.predicted for row in report.rows}
    assert rows["all", "requests_per_s"] == pytest.approx(4.0, rel=0.005)


def test_a_stage_that_sent_no_request_keeps_its_time_in_the_whole_run():
    """Two 10-s stages cut to 3 s after 4-s warm-ups; the second's measured part sent no
    request (a low rate), so the stages table has no row for it: its 2 x 3 s still count
    in all's span (4 + 6 + 4 + 6 s, the last stage's drain 0), not only the stages that
    sent requests (which made a slow run's rates look 40% higher)."""
    import pandas as pd

    from kvsim.accuracy.whole_run import stage_weights, weighted_whole_run

    exp = _exp([{"rate": 1, "duration": 10}, {"rate": 1, "duration": 10}])
    run, measured = shortened(exp, 3, 4)
    weights = stage_weights(exp, run, measured)
    assert weights == [1.0, 2.0, 1.0, 2.0]
    requests = pd.DataFrame(
        {
            "stage": [0, 1, 2],
            "rejected": [False] * 3,
            "ttft_s": [0.1, 0.1, 0.1],
            "e2e_s": [1.0, 1.0, 1.0],
        }
    )
    rows = [
        {"stage": s, "duration": d, "total_input_tokens": 100, "total_output_tokens": 10}
        for s, d in ((0, 4.5), (1, 3.5), (2, 4.5), ("all", 18.0))
    ]
    whole = weighted_whole_run(pd.DataFrame(rows), requests, run, weights).iloc[-1]
    assert whole["completed"] == 4
    assert whole["duration"] == pytest.approx(4 + 2 * 3 + 4 + 2 * 3)
