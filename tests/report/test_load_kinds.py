"""Issue 28 item 2: overloaded (a lasting excess) told apart from bursty (a tail of waits at a
moderate load), each with its own warning; in a sweep every warning names its cell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvsim.report.serve_metrics import BurstyLoadWarning, Load, OverloadWarning


def _requests(arrivals, queues, ttft_extra=0.01, prompt=1000):
    arrivals = np.asarray(arrivals, float)
    queues = np.asarray(queues, float)
    return pd.DataFrame(
        {
            "arrival_s": arrivals,
            "queue_s": queues,
            "ttft_s": queues + ttft_extra,
            "prompt_tokens": prompt,
            "rejected": False,
        }
    )


STEP = 0.01
ITLS = np.full(100, STEP)


def test_a_burst_at_moderate_load_is_bursty_not_overloaded():
    # 90 requests that never wait, then a burst of 10 that waits long; the GPU idles mostly
    queues = [0.0] * 45 + [5.0] * 10 + [0.0] * 45
    load = Load.of(
        _requests(np.arange(100.0), queues), ITLS.copy(), busy_s=25.0, steps=2500, duration=100.0
    )
    assert load.queue_dominates() and not load.reasons()
    assert load.kind() == "bursty" and load.fields()["load"] == "bursty"
    assert load.fields()["overloaded"] is False
    message, category = load.warning("with offloading")
    assert category is BurstyLoadWarning
    assert (
        message.startswith("bursty arrivals (with offloading)")
        and "median queue is 0 ms" in message
    )
    assert "busy 25%" in message and "overload" in message


def test_a_queue_that_grows_through_the_run_is_overload():
    queues = np.linspace(0.0, 10.0, 99)
    load = Load.of(
        _requests(np.arange(99.0), queues), ITLS.copy(), busy_s=50.0, steps=5000, duration=100.0
    )
    assert load.queue_growth is not None and load.queue_growth > 2
    (reason,) = load.reasons()
    assert "growing through the run" in reason
    message, category = load.warning("without offloading")
    assert category is OverloadWarning and message.startswith("overloaded (without offloading)")


def test_a_gpu_busy_all_the_time_with_queueing_is_overload():
    queues = [1.0] * 30
    load = Load.of(
        _requests(np.zeros(30), queues), ITLS.copy(), busy_s=9.9, steps=990, duration=10.0
    )
    (reason,) = load.reasons()
    assert "GPU busy 99%" in reason and load.kind() == "overloaded"


def test_a_short_run_whose_queue_grows_from_nothing_to_a_step_is_not_overloaded():
    """Four requests, the first third never waiting, the last waiting 2 ms: infinitely
    more, yet no backlog (a quick run's cold pass, with the GPU busy throughout); it was
    warned as overloaded, in every `kvsim accuracy --max-stage-s` run."""
    queues = [0.0, 0.0, 0.0015, 0.002]
    load = Load.of(
        _requests([0.0, 0.25, 0.5, 0.75], queues, prompt=700),
        ITLS.copy(),
        busy_s=1.0,
        steps=100,
        duration=1.0,
    )
    assert load.queue_growth == float("inf") and load.offered > load.sustainable
    assert load.reasons() == [] and load.warning("with offloading") is None


def test_a_steady_run_says_nothing():
    load = Load.of(
        _requests(np.arange(50.0), np.zeros(50)),
        ITLS.copy(),
        busy_s=10.0,
        steps=1000,
        duration=50.0,
    )
    assert load.kind() == "steady" and load.warning("x") is None


def test_a_gpu_busy_decoding_with_nobody_waiting_is_steady():
    """A steady load of long outputs: the GPU decodes the whole run and past the last
    arrival (busy time over the arrival span above 1, so offered > sustainable), yet every
    request is admitted at once: not overload."""
    load = Load.of(
        _requests(np.arange(50.0), np.zeros(50)),
        ITLS.copy(),
        busy_s=52.0,
        steps=5200,
        duration=52.0,
    )
    assert load.offered is not None and load.sustainable is not None
    assert load.offered > load.sustainable and load.busy_frac >= 0.95
    assert load.kind() == "steady" and load.warning("x") is None


@pytest.mark.parametrize("kind", ["bursty", "overloaded"])
def test_every_kind_of_load_warning_is_an_input_warning(kind):
    from kvsim.core.errors import InputWarning
    from kvsim.report.serve_metrics import LoadWarning

    cls = BurstyLoadWarning if kind == "bursty" else OverloadWarning
    assert issubclass(cls, LoadWarning) and issubclass(cls, InputWarning)


def test_sweep_warnings_name_their_cell(tmp_path, capsys):
    """A timed sweep whose cells are overloaded on purpose: each warning names its cell."""
    import json

    from kvsim.cli import main

    trace = tmp_path / "burst.jsonl"
    rows = [
        {
            "timestamp": 0,
            "input_length": 2000,
            "output_length": 20,
            "hash_ids": [i, i + 1000, i + 2000, i + 3000],
        }
        for i in range(40)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    compute = tmp_path / "c.json"
    compute.write_text(json.dumps({"kind": "linear", "step_s": 0.01, "per_token_s": 0.0001}))
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"traces: [{trace}]\nmode: timed\n"
        f"options: {{compute_profile: {compute}, max_num_seqs: 1}}\n"
        "grid: {cpu_chunks: [64, 128]}\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "sweep",
                str(spec),
                "--out",
                str(tmp_path / "out"),
                "--executor",
                "serial",
                "--no-progress",
            ]
        )
    assert exc.value.code == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("kvsim: warning: cell ")]
    assert lines, err
    assert {ln.split(" (", 1)[0] for ln in lines} == {
        "kvsim: warning: cell 0",
        "kvsim: warning: cell 1",
    }
    assert all("cpu_chunks=" in ln and "overloaded" in ln for ln in lines)
