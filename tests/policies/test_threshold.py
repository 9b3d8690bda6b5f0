"""StoreThresholdAdmission: vLLM's store_threshold tracker (semantics doc §4)."""

from __future__ import annotations

import pytest

from kvsim.core.errors import InputError
from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.admission.threshold import StoreThresholdAdmission
from kvsim.policies.registry import make_admission


def offer(adm, keys):
    adm.record_offer(keys)
    return adm.admit(list(keys))


def test_filter_reused_sequence_counts():
    adm = StoreThresholdAdmission(2, max_tracker_size=3)
    assert offer(adm, [1, 2]) == []
    assert dict(adm.counts) == {1: 1, 2: 1}
    assert offer(adm, [1, 2]) == [1, 2]
    assert offer(adm, [3, 4]) == []
    assert dict(adm.counts) == {2: 2, 3: 1, 4: 1}  # 1 was the LRU tracked key
    assert offer(adm, [1]) == []  # re-tracked at 1
    assert dict(adm.counts) == {3: 1, 4: 1, 1: 1}


def test_current_offer_is_never_dropped_for_itself():
    adm = StoreThresholdAdmission(2, max_tracker_size=3)
    offer(adm, [1, 2, 3, 4])
    assert list(adm.counts) == [1, 2, 3]  # 4 is not tracked this time
    assert offer(adm, [1, 2, 3, 4]) == [1, 2, 3]
    assert offer(adm, [4]) == []  # now it displaces the LRU key
    assert list(adm.counts) == [2, 3, 4]
    assert offer(adm, [4]) == [4]


def test_offer_refreshes_tracker_order_and_counts_never_decay():
    adm = StoreThresholdAdmission(3, max_tracker_size=2)
    offer(adm, [1])
    offer(adm, [2])
    offer(adm, [1])  # 1 becomes MRU
    offer(adm, [3])  # drops 2
    assert dict(adm.counts) == {1: 2, 3: 1}
    assert offer(adm, [1]) == [1]
    assert offer(adm, [1]) == [1]  # admitted keys keep their count
    assert adm.counts[1] == 4


def test_admit_keeps_order():
    adm = StoreThresholdAdmission(2)
    offer(adm, [5, 4, 3])
    assert offer(adm, [3, 5, 4, 6]) == [3, 5, 4]


@pytest.mark.parametrize("threshold,tracker", [(1, 10), (0, 10), (2, 0)])
def test_invalid_settings(threshold, tracker):
    with pytest.raises(InputError):
        StoreThresholdAdmission(threshold, tracker)


def test_make_admission_follows_vllm_store_threshold():
    assert type(make_admission()) is AdmissionPolicy
    assert type(make_admission(store_threshold=1)) is AdmissionPolicy  # < 2 disables it
    adm = make_admission(store_threshold=3, max_tracker_size=7)
    assert isinstance(adm, StoreThresholdAdmission)
    assert (adm.store_threshold, adm.max_tracker_size) == (3, 7)


def test_clear():
    adm = StoreThresholdAdmission(2)
    offer(adm, [1])
    adm.clear()
    assert offer(adm, [1]) == []


def test_threshold_takes_its_n_as_an_argument():
    rule = make_admission("threshold:3", max_tracker_size=10)
    assert isinstance(rule, StoreThresholdAdmission)
    assert (rule.store_threshold, rule.max_tracker_size) == (3, 10)
    with pytest.raises(InputError, match="threshold:N needs an integer"):
        make_admission("threshold:x")


@pytest.mark.parametrize("spec", ["tinylfu", "probabilistic:0.5", "threshold:4"])
def test_a_store_threshold_beside_another_rule_is_refused(spec):
    """vLLM's store_threshold is the threshold rule: with another rule it was ignored
    (and the summary still reported it)."""
    with pytest.raises(InputError, match="--store-threshold 3 is vLLM's threshold rule"):
        make_admission(spec, store_threshold=3)


@pytest.mark.parametrize(
    ("kwargs", "applied"),
    [
        ({"admission": "threshold"}, 2),
        ({"admission": "threshold:3"}, 3),
        ({"store_threshold": 3}, 3),
        ({"admission": "tinylfu"}, 0),
        ({}, 0),
    ],
)
def test_the_summary_reports_the_threshold_applied(kwargs, applied):
    from support import SAMPLE

    import kvsim

    summary = kvsim.replay(SAMPLE, cpu_chunks=1000, limit=50, **kwargs).summary
    assert summary["store_threshold"] == applied
