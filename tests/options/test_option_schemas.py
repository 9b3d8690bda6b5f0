"""The user-facing structures described once (kvsim.options): offload options, vLLM's
connector configs, the engine's knobs and the registry that names them."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from kvsim.core.errors import InputError
from kvsim.options.engine import EngineParams
from kvsim.options.offload import OFFLOAD_FIELDS, OffloadOptions
from kvsim.options.registry import SCHEMAS, schema_named
from kvsim.options.schema import field, json_schema, load
from kvsim.options.vllm import (
    VLLM_DEFAULTS,
    KVConnectorExtraConfig,
    KVTransferConfig,
    extra_config,
    options_from_vllm_config,
)


def _error(fn, *args, **kw) -> str:
    with pytest.raises(InputError) as info:
        fn(*args, **kw)
    return str(info.value)


def test_an_option_names_its_flag_bound_and_value():
    assert _error(OffloadOptions, cpu_chunks=0) == "--cpu-chunks: Expected `int` >= 1, got 0"
    assert _error(OffloadOptions, seed=-1) == "--seed: Expected `int` >= 0, got -1"
    assert _error(OffloadOptions, cpu_gib=float("inf")) == "--cpu-gib: must be finite, got inf"
    assert _error(OffloadOptions, tp=0) == "--tp: Expected `int` >= 1, got 0"
    assert _error(OffloadOptions, cpu_bytes=0).startswith("cpu_bytes_to_use: ")


def test_numpy_numbers_are_the_numbers_they_hold():
    opts = OffloadOptions(cpu_chunks=np.int64(7), cpu_gib=None, tp=np.int32(2))
    assert type(opts.cpu_chunks) is int and opts.cpu_chunks == 7 and opts.tp == 2
    assert EngineParams(time_scale=np.float64(0.5)).time_scale == 0.5


def test_options_loaded_from_a_file_name_the_file_and_the_key_path():
    msg = _error(load, OffloadOptions, {"polcy": "arc"}, source="spec.yaml", prefix="options")
    assert msg == "spec.yaml: options.polcy: unknown key (did you mean 'policy'?), got 'arc'"


def test_every_offload_field_has_a_help_text():
    assert OFFLOAD_FIELDS[0] == "cpu_chunks" and "secondary_tiers" in OFFLOAD_FIELDS
    for name in OFFLOAD_FIELDS:
        assert field(OffloadOptions, name).description, name
    assert field(OffloadOptions, "cpu_gib").extra["aliases"] == ["--kv-offloading-size"]
    assert field(OffloadOptions, "tp").kind is int


def test_the_extra_config_keeps_what_was_given_and_knows_vllms_defaults():
    cfg = extra_config({"store_threshold": 3, "self_describing_kv_events": True})
    assert cfg.given() == {"store_threshold": 3, "self_describing_kv_events": True}
    assert cfg.value("max_tracker_size") == 64_000 and cfg.value("store_threshold") == 3
    props = json_schema(KVConnectorExtraConfig)["$defs"]["KVConnectorExtraConfig"]["properties"]
    for key, default in VLLM_DEFAULTS.items():
        assert props[key]["default"] == default, key
    assert props["store_threshold"]["minimum"] == 0


def test_an_explicit_extra_config_key_wins_over_the_base_options():
    base = OffloadOptions(cpu_chunks=4, policy="arc")
    assert options_from_vllm_config({"eviction_policy": "lru"}, base).policy == "lru"
    assert options_from_vllm_config({}, base).policy == "arc"  # not given: base's


def test_a_misspelt_extra_config_key_gets_the_closest_one():
    msg = _error(extra_config, {"store_treshold": 2})
    assert msg.startswith("--vllm-config: store_treshold: unknown key")
    assert "did you mean 'store_threshold'?" in msg


def test_a_kv_transfer_config_as_measurement_files_embed_it_loads():
    text = """
    kv_transfer_config:
      kv_connector: OffloadingConnector
      kv_role: kv_both
      kv_connector_extra_config:
        cpu_bytes_to_use: 8589934592
    """
    cfg = load(KVTransferConfig, yaml.safe_load(text)["kv_transfer_config"], source="m.yaml")
    assert cfg.kv_connector_extra_config.value("cpu_bytes_to_use") == 8 * 2**30
    assert cfg.kv_connector_extra_config.value("eviction_policy") == "lru"
    bad = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert _error(load, KVTransferConfig, bad, source="m.yaml").startswith(
        "m.yaml: kv_connector: must be one of OffloadingConnector, got 'NixlConnector'"
    )


def test_the_registry_names_every_structure_and_guesses_typos():
    for name in SCHEMAS:
        assert json_schema(schema_named(name))["$defs"], name
    assert "did you mean 'kv-transfer-config'?" in _error(schema_named, "kv-transfer-cfg")
