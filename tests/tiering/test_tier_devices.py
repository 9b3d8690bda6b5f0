"""The secondary tiers' device model: presets, closed-form job times, the queue model."""

from __future__ import annotations

import json
import math

import pytest

from kvsim.core.errors import InputError
from kvsim.options.tiers import as_tier_specs, tier_from_shorthand
from kvsim.tiering.devices import (
    DEFAULT_DEVICES,
    TierDevice,
    device_presets,
    load_device,
    tier_device,
)

MB = 10**8  # 100 MB: with 1 GB/s a tenth of a second, easy to add up by hand


def device_json(tmp_path, **changes):
    data = {
        "read_bytes_per_s": 1e9,
        "write_bytes_per_s": 1e9,
        "stream_read_bytes_per_s": 1e9,
        "stream_write_bytes_per_s": 1e9,
        "read_latency_s": 0.01,
        "write_latency_s": 0.02,
        "lookup_latency_s": 0.001,
        "n_read_threads": 2,
        "n_write_threads": 2,
    }
    data.update(changes)
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(data))
    return str(path)


def run_one(spec, read, chunks, nbytes=MB):
    dev = TierDevice(spec)
    dev.submit(7, read, chunks, nbytes, 0.0)
    dev.advance(math.inf)
    [(t, job)] = dev.take_finished()
    assert job == 7
    return t


def test_presets_load_and_every_figure_has_a_source():
    for name in ("nvme-gen4", "nvme-gen5", "shared-fs", "object-store", "instant"):
        spec = load_device(name)
        assert spec.name == name
        if name != "instant":
            for key in (
                "read_bytes_per_s",
                "write_bytes_per_s",
                "stream_read_bytes_per_s",
                "stream_write_bytes_per_s",
                "read_latency_s",
                "write_latency_s",
                "lookup_latency_s",
                "n_read_threads",
                "n_write_threads",
            ):
                assert spec.source.get(key), (name, key)
    assert set(DEFAULT_DEVICES.values()) <= set(device_presets())


def test_job_time_by_hand(tmp_path):
    spec = load_device(device_json(tmp_path))
    # 4 reads on 2 threads: two rounds of two operations sharing 1 GB/s
    # each op 0.01 s + 1e8 B / 5e8 B/s = 0.21 s
    assert spec.job_time(True, 4, MB) == pytest.approx(0.42)
    # 3 reads: one round of two (0.21 s), then one alone at full rate (0.01 + 0.1)
    assert spec.job_time(True, 3, MB) == pytest.approx(0.32)
    # a write alone: 0.02 + 0.1
    assert spec.job_time(False, 1, MB) == pytest.approx(0.12)


@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("read", [True, False])
def test_queue_model_matches_the_closed_form_on_an_idle_device(tmp_path, chunks, read):
    spec = load_device(device_json(tmp_path, stream_read_bytes_per_s=7e8))
    assert run_one(spec, read, chunks) == pytest.approx(spec.job_time(read, chunks, MB))


def test_stream_cap_limits_a_lone_operation(tmp_path):
    spec = load_device(device_json(tmp_path, stream_read_bytes_per_s=2.5e8))
    # one op: 0.01 + 1e8 / 2.5e8 (the stream cap, not the device's 1 GB/s)
    assert run_one(spec, True, 1) == pytest.approx(0.41)


def test_a_load_waits_for_a_read_thread_busy_with_stores(tmp_path):
    """1 read + 1 write thread. Two store jobs fill both threads (the read thread falls back
    to the store queue); a load submitted at 0.05 s waits for the first free thread."""
    spec = load_device(device_json(tmp_path, n_read_threads=1, n_write_threads=1))
    dev = TierDevice(spec)
    dev.submit(1, False, 1, MB, 0.0)  # write thread: 0.02 + 1e8 / 5e8 (shared) ...
    dev.submit(2, False, 1, MB, 0.0)  # ... read thread takes this one: both 0.22 s
    dev.submit(3, True, 1, MB, 0.05)
    dev.advance(math.inf)
    done = dict((job, t) for t, job in dev.take_finished())
    assert done[1] == pytest.approx(0.22)
    assert done[2] == pytest.approx(0.22)
    # the load starts at 0.22 on a free thread: 0.01 + 0.1 (reads have their own bandwidth)
    assert done[3] == pytest.approx(0.33)


def test_reads_and_writes_have_separate_bandwidth(tmp_path):
    spec = load_device(device_json(tmp_path, read_latency_s=0.0, write_latency_s=0.0))
    dev = TierDevice(spec)
    dev.submit(1, True, 1, MB, 0.0)
    dev.submit(2, False, 1, MB, 0.0)
    dev.advance(math.inf)
    assert [t for t, _ in dev.take_finished()] == pytest.approx([0.1, 0.1])


def test_next_finish_time_does_not_move_the_device(tmp_path):
    spec = load_device(device_json(tmp_path))
    dev = TierDevice(spec)
    dev.submit(1, True, 3, MB, 1.0)
    assert dev.next_finish_time() == pytest.approx(1.32)
    assert dev.now == 1.0 and not dev.finished
    dev.advance(1.2)
    assert not dev.finished
    dev.advance(2.0)
    assert dev.take_finished() == [(pytest.approx(1.32), 1)]


def test_instant_device_finishes_at_submission():
    dev = TierDevice(load_device("instant"))
    dev.submit(1, True, 40, 64 << 20, 3.0)
    dev.advance(3.0)
    assert dev.take_finished() == [(3.0, 1)]


def test_deterministic():
    spec = load_device("nvme-gen4")

    def run():
        dev = TierDevice(spec)
        for i in range(30):
            dev.submit(i, i % 3 == 0, 1 + i % 7, 64 << 20, i * 0.01)
        dev.advance(math.inf)
        return dev.take_finished()

    assert run() == run()


def test_bad_devices_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="unknown device 'nvme-gen9'"):
        load_device("nvme-gen9")
    path = device_json(tmp_path)
    with open(path) as f:
        data = json.load(f)
    del data["read_latency_s"]
    (tmp_path / "missing.json").write_text(json.dumps(data))
    with pytest.raises(
        InputError, match=r"missing\.json: read_latency_s: missing \(a required key\)$"
    ):
        load_device(str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match=r"n_read_threads: Expected `int` >= 1, got 0$"):
        load_device(device_json(tmp_path, n_read_threads=0))
    with pytest.raises(InputError, match=r"read_bytes_per_s: Expected `float` > 0.0, got 0$"):
        load_device(device_json(tmp_path, read_bytes_per_s=0))


def test_tier_spec_picks_device_and_threads():
    [fs] = as_tier_specs([tier_from_shorthand("fs:device=nvme-gen5,n_read_threads=4")])
    spec = tier_device(fs, "t")
    assert (spec.name, spec.n_read_threads, spec.n_write_threads) == ("nvme-gen5", 4, 16)
    [obj] = as_tier_specs([{"type": "obj", "io_threads": 8}])
    spec = tier_device(obj, "t")
    assert (spec.name, spec.n_read_threads, spec.n_write_threads) == ("object-store", 8, 8)
    [ex] = as_tier_specs([{"type": "example"}])
    assert tier_device(ex, "t").name == "instant"
    with pytest.raises(InputError, match="kvsim_load_rule"):
        as_tier_specs([{"type": "fs", "kvsim_load_rule": "sometimes"}])
