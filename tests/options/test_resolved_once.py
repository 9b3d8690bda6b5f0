"""Names become objects once: a configuration's policy class is resolved once and kept,
and re-sizing options with their model already resolved looks no name up."""

from __future__ import annotations

import dataclasses

import pytest

from kvsim.options.offload import OffloadOptions
from kvsim.policies import registry
from kvsim.policies.arc import ARCPolicy
from kvsim.policies.lru import LRUPolicy


def test_a_configs_policy_class_is_resolved_once_and_follows_a_copy(monkeypatch):
    config = OffloadOptions(cpu_chunks=8, model=None).resolve(16)
    calls: list[tuple[str, str | None]] = []
    real = registry.eviction_policy_class

    def counting(spec: str, module_path: str | None = None):
        calls.append((spec, module_path))
        return real(spec, module_path)

    monkeypatch.setattr(registry, "eviction_policy_class", counting)
    assert registry.config_policy_class(config) is LRUPolicy
    assert registry.config_policy_class(config) is LRUPolicy
    assert calls == [("lru", None)]
    other = dataclasses.replace(config, policy="arc")  # a copy names another policy
    assert registry.config_policy_class(other) is ARCPolicy
    assert calls == [("lru", None), ("arc", None)]


def test_resolving_again_with_the_model_looks_no_name_up(monkeypatch):
    options = OffloadOptions(cpu_gib=4.0, model="llama-3.1-8b")
    first = options.resolve(16)
    assert first.model_spec is not None

    def no_lookup(name: str):
        raise AssertionError(f"looked {name!r} up again")

    monkeypatch.setattr("kvsim.specs.models.get_model", no_lookup)
    again = options.with_(cpu_gib=8.0).resolve(16, first.model_spec)
    assert again.model_spec == first.model_spec
    assert again.num_chunks == pytest.approx(2 * first.num_chunks, rel=0.01)
    with pytest.raises(AssertionError, match=r"looked 'llama-3\.1-8b' up again"):
        options.resolve(16)
