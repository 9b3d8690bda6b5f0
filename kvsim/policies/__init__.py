"""Eviction and admission policies."""

from kvsim.policies.admission import AdmissionPolicy, StoreThresholdAdmission
from kvsim.policies.arc import ARCPolicy
from kvsim.policies.base import Chunk, EvictionPolicy
from kvsim.policies.lru import LRUPolicy
from kvsim.policies.registry import (
    describe_policies,
    eviction_policy_class,
    make_admission,
    make_eviction_policy,
    register_admission,
    register_eviction,
)

__all__ = [
    "ARCPolicy",
    "AdmissionPolicy",
    "Chunk",
    "EvictionPolicy",
    "LRUPolicy",
    "StoreThresholdAdmission",
    "describe_policies",
    "eviction_policy_class",
    "make_admission",
    "make_eviction_policy",
    "register_admission",
    "register_eviction",
]
