"""An admission policy says with class flags which hooks it uses; managers read the flags."""

from __future__ import annotations

import pytest

from kvsim.cachemode.fused_lru import FusedLRUTier
from kvsim.manager.offload import OffloadManager
from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.registry import ADMISSION_POLICIES, make_eviction_policy


@pytest.mark.parametrize("name", sorted(ADMISSION_POLICIES))
def test_each_builtin_flags_the_hooks_it_overrides(name):
    cls = ADMISSION_POLICIES[name]
    assert cls.filters == (cls.admit is not AdmissionPolicy.admit), name
    assert cls.records_offers == (cls.record_offer is not AdmissionPolicy.record_offer), name


class _Refuses(AdmissionPolicy):
    """Keeps every candidate out, and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def admit(self, candidates, ctx=None):
        self.calls += 1
        return []


class _Filters(_Refuses):
    filters = True


def _stored(admission: AdmissionPolicy) -> tuple[int, int]:
    """(chunks stored by the manager, by the fused tier) for one request of 4 chunks."""
    manager = OffloadManager(8, make_eviction_policy("lru", 8), admission)
    ctx = manager.new_context("r", {k: i for i, k in enumerate((1, 2, 3, 4))})
    out = manager.prepare_store([1, 2, 3, 4], ctx)
    assert out is not None
    tier = FusedLRUTier(8, 16, None, admission)
    return len(out.keys_to_store), tier.serve("r", [1, 2, 3, 4], 0, 4, 64).stored


def test_the_flag_not_the_method_decides_whether_admit_is_called():
    unflagged, flagged = _Refuses(), _Filters()
    assert _stored(unflagged) == (4, 4) and unflagged.calls == 0
    assert _stored(flagged) == (0, 0) and flagged.calls == 2
