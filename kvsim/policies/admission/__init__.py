"""Admission policies (see ``kvsim.policies.registry`` for lookup by name)."""

from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.admission.threshold import StoreThresholdAdmission

__all__ = ["AdmissionPolicy", "StoreThresholdAdmission"]
