"""Transfer-model arithmetic, the profile JSON, and the simulated backend's queues."""

from __future__ import annotations

import json

import pytest

from kvsim.core.errors import InputError
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.transfer_model import (
    LINK_PRESETS,
    DirectionParams,
    TransferModelParams,
    get_link,
    load_transfer_profile,
)
from kvsim.engine.transfer_protocol import EXPEDITED, LOAD, STORE, TransferJob


def flat(gbps: float, overhead: float = 0.0, per_copy: float = 0.0) -> DirectionParams:
    return DirectionParams(overhead, per_copy, ((1.0, gbps),))


def job(i: int, direction: str, nbytes: int, copies: int = 1, t: float = 0.0) -> TransferJob:
    return TransferJob(i, direction, [], [], nbytes, copies, (), t)


def test_job_time_formula_and_interpolation():
    d = DirectionParams(1e-3, 1e-6, ((1000.0, 1.0), (3000.0, 3.0)))
    assert d.bandwidth(500) == 1e9 and d.bandwidth(5000) == 3e9
    assert d.bandwidth(2000) == pytest.approx(2e9)
    assert d.job_time(2_000_000, 1000) == pytest.approx(1e-3 + 1000 * 1e-6 + 2_000_000 / 2e9)


def test_two_gib_load_of_64k_pages_pays_the_host_submission():
    h2d = LINK_PRESETS["pcie5"].h2d
    copies = 2**31 // 65536  # 64 KiB pages: Llama-3.1-8B, 16-token blocks, one layer each
    # 0.5 us of host time per descriptor (16.4 ms) + 40 ms of copy at 54.1 GB/s
    assert h2d.job_time(2**31, copies) == pytest.approx(0.056, abs=0.001)


def test_small_copies_pay_the_dma_cliff():
    h2d = LINK_PRESETS["pcie5"].h2d
    n = 50_000  # descriptors in the call (the cliff deepens with their number)
    assert h2d.bandwidth(8 * 1024, n) < 10e9 < 40e9 < h2d.bandwidth(64 * 1024, n)


def test_profile_roundtrip(tmp_path):
    p = LINK_PRESETS["pcie5"]
    path = tmp_path / "link.json"
    path.write_text(p.to_json())
    assert load_transfer_profile(path) == p
    assert get_link(str(path)) == p
    assert json.loads(p.to_json())["version"] == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"version": 2},
        {"version": 1, "h2d": {"overhead_s": 0, "per_copy_s": 0, "curve": [[10, 1]]}},
        {
            "version": 1,
            "h2d": {"overhead_s": 0, "per_copy_s": 0, "curve": [[10, 1], [5, 2]]},
            "d2h": {"overhead_s": 0, "per_copy_s": 0, "curve": [[10, 1]]},
        },
        {
            "version": 1,
            "h2d": {"overhead_s": 0, "per_copy_s": 0, "curve": [[10, 1]]},
            "d2h": {"overhead_s": 0, "per_copy_s": 0, "curve": [[10, 1]]},
            "duplex_factor": 1.5,
        },
    ],
)
def test_bad_profiles_are_one_line_input_errors(tmp_path, bad):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"bad\.json"):
        load_transfer_profile(path)


def test_unknown_link():
    with pytest.raises(InputError, match="unknown link"):
        get_link("pcie9")


def test_queue_is_fifo_one_job_at_a_time():
    b = SimulatedTransferBackend(TransferModelParams("t", flat(1.0, overhead=0.5), flat(1.0), 1.0))
    b.submit(job(1, LOAD, 10**9), 0.0)
    b.submit(job(2, LOAD, 10**9, t=0.2), 0.2)
    assert b.next_completion_time() == pytest.approx(1.5)
    assert b.poll(1.4) == []
    first = b.poll(1.5)
    assert [(r.job_id, r.start_time, r.end_time) for r in first] == [(1, 0.0, pytest.approx(1.5))]
    second = b.poll(10.0)
    assert [(r.job_id, r.start_time, r.end_time) for r in second] == [
        (2, pytest.approx(1.5), pytest.approx(3.0))
    ]
    assert b.poll(20.0) == [] and not b.busy


def test_directions_overlap_with_duplex_sharing():
    b = SimulatedTransferBackend(TransferModelParams("t", flat(1.0), flat(1.0), 0.5))
    b.submit(job(1, STORE, 10**9), 0.0)
    b.submit(job(2, LOAD, 2 * 10**9), 0.0)
    # both at half rate until the store ends at 2 s; the load has 1 GB left at full rate
    done = b.poll(10.0)
    ends = {r.job_id: r.end_time for r in done}
    assert ends == {1: pytest.approx(2.0), 2: pytest.approx(3.0)}


def test_two_load_queues_split_the_h2d_rate():
    b = SimulatedTransferBackend(TransferModelParams("t", flat(1.0), flat(1.0), 1.0))
    b.submit(job(1, LOAD, 10**9), 0.0)
    b.submit(job(2, EXPEDITED, 10**9), 0.0)
    t, results = b.wait([2], 0.0)
    assert t == pytest.approx(2.0) and [r.job_id for r in results] == [2]
    assert {r.job_id for r in b.poll(t)} == {1, 2}


def test_next_completion_time_does_not_change_state():
    b = SimulatedTransferBackend(TransferModelParams("t", flat(1.0), flat(1.0), 1.0))
    b.submit(job(1, STORE, 10**9), 0.0)
    assert b.next_completion_time() == pytest.approx(1.0)
    assert b.next_completion_time() == pytest.approx(1.0)
    assert b.poll(0.5) == []
    assert [r.job_id for r in b.poll(1.0)] == [1]


def test_host_time_runs_from_the_submit_call_not_from_the_copy_start():
    # a store submitted at t=0 for a forward that ends at t=1: its 0.4 s of host time
    # (400 descriptors x 1 ms) overlaps the forward; the copy starts at 1.0 and moves 1 GB
    # at 1 GB/s; a second job's host time queues behind the first's on the one thread
    d = flat(1.0, per_copy=1e-3)
    b = SimulatedTransferBackend(TransferModelParams("t", d, d, 1.0))
    b.submit(job(1, STORE, 10**9, copies=400, t=1.0), 0.0)
    assert b.host_free_time() == pytest.approx(0.4)
    b.submit(job(2, LOAD, 10**9, copies=100, t=0.1), 0.1)
    assert b.host_free_time() == pytest.approx(0.5)
    done = {r.job_id: (r.start_time, r.end_time) for r in b.poll(10.0)}
    assert done[1] == (pytest.approx(1.0), pytest.approx(2.0))
    assert done[2] == (pytest.approx(0.1), pytest.approx(1.5))  # its host part ends at 0.5
