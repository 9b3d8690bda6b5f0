"""KeyLayout (split and group), OffloadOptions.resolve and options_from_vllm_config."""

from __future__ import annotations

import json

import pytest

from kvsim.core.errors import InputError
from kvsim.core.keys import KeyLayout
from kvsim.options.offload import OffloadOptions
from kvsim.options.vllm import load_vllm_config, options_from_vllm_config


def test_layout_identity():
    lay = KeyLayout(512, 512)
    assert (lay.unit_tokens, lay.split, lay.units_per_chunk) == (512, 1, 1)
    assert lay.unit_keys((7, 8, 9), 1100) == [7, 8]  # the partial third block has no key
    assert lay.chunk_keys([7, 8]) == [7, 8]


def test_layout_split_blocks_into_distinct_subkeys():
    lay = KeyLayout(512, 128)  # 4 chunks per trace block
    assert (lay.unit_tokens, lay.split, lay.units_per_chunk) == (128, 4, 1)
    keys = lay.unit_keys((5, 6), 700)  # 700 // 128 = 5 complete units
    assert keys == [20, 21, 22, 23, 24]
    other = lay.unit_keys((5, 7), 1024)
    assert other[:4] == keys[:4] and other[4] != keys[4]  # prefix identity is kept
    assert len(set(lay.unit_keys((1, 2, 3), 1536)) | set(lay.unit_keys((4, 5, 6), 1536))) == 24
    assert lay.unit_keys((5,), 2048) == [20, 21, 22, 23]  # no more units than hash ids cover


def test_layout_groups_blocks_into_chunks_keyed_by_last_block():
    lay = KeyLayout(16, 64)
    assert (lay.unit_tokens, lay.split, lay.units_per_chunk) == (16, 1, 4)
    units = lay.unit_keys(tuple(range(100, 110)), 160)
    assert lay.chunk_keys(units) == [103, 107]  # 10 units: 2 complete chunks


@pytest.mark.parametrize("b,c", [(0, 16), (16, 0), (16, 24), (48, 32)])
def test_layout_rejects_bad_sizes(b, c):
    with pytest.raises(InputError):
        KeyLayout(b, c)


def test_resolve_defaults_and_sizes():
    cfg = OffloadOptions(cpu_chunks=10).resolve(512)
    assert (cfg.num_chunks, cfg.block_tokens, cfg.chunk_tokens, cfg.policy) == (10, 512, 512, "lru")
    assert (cfg.gpu_blocks, cfg.store_threshold, cfg.max_tracker_size) == (0, 0, 64_000)
    cfg = OffloadOptions(cpu_gib=100, chunk_tokens=16).resolve(16)  # doc §1.4 worked example
    assert cfg.num_chunks == 51_200 and cfg.chunk_bytes == 2 * 2**20
    assert OffloadOptions(cpu_gib=1).resolve(512).num_chunks == 16  # 64 MiB chunks


@pytest.mark.parametrize(
    "opts,needle",
    [
        (dict(), "CPU tier size"),
        (dict(cpu_chunks=1, cpu_gib=1.0), "only one"),
        (dict(cpu_chunks=0), "--cpu-chunks"),
        (dict(cpu_chunks=4, gpu_blocks=-1), "--gpu-blocks"),
        (dict(cpu_chunks=4, store_threshold=-1), "--store-threshold"),
        (dict(cpu_chunks=4, max_tracker_size=0), "--max-tracker-size"),
        (dict(cpu_gib=1.0, model=None), "--model"),
        (dict(cpu_gib=1e-6), "--cpu-gib"),  # too small for one chunk
        (dict(cpu_chunks=4, chunk_tokens=24), "--chunk-tokens"),
    ],
)
def test_resolve_errors_name_the_option(opts, needle):
    with pytest.raises(InputError, match=needle.replace("-", r"\-")):
        OffloadOptions(**opts).resolve(16)


def test_vllm_config_translation():
    opts = options_from_vllm_config(
        {
            "cpu_bytes_to_use": 100 * 2**30,
            "blocks_per_chunk": 2,
            "eviction_policy": "arc",
            "store_threshold": 2,
            "max_tracker_size": 10,
            "spec_name": "CPUOffloadingSpec",
            "offload_prompt_only": True,
        }
    )
    assert (opts.cpu_bytes, opts.chunk_tokens, opts.policy) == (100 * 2**30, 32, "arc")
    assert (opts.store_threshold, opts.max_tracker_size) == (2, 10)
    assert opts.resolve(16).num_chunks == 25_600
    assert options_from_vllm_config({"block_size": 64}).chunk_tokens == 64
    defaults = options_from_vllm_config({"cpu_bytes_to_use": 2**30})
    assert (defaults.chunk_tokens, defaults.policy, defaults.store_threshold) == (16, "lru", 0)
    custom = options_from_vllm_config(
        {"eviction_policy": "Mine", "cache_policy_module_path": "pkg.mod"}
    )
    assert (custom.policy, custom.policy_module) == ("Mine", "pkg.mod")


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"block_size": 32, "blocks_per_chunk": 2}, "cannot be combined"),
        ({"cpu_bytes": 1}, "unknown key"),
        ({"blocks_per_chunk": 0}, "blocks_per_chunk"),
        ({"store_threshold": "2"}, "store_threshold"),
        ({"cpu_bytes_to_use": True}, "cpu_bytes_to_use"),
    ],
)
def test_vllm_config_errors(extra, needle):
    with pytest.raises(InputError, match=needle):
        options_from_vllm_config(extra)


def test_load_vllm_config_forms(tmp_path):
    inner = {"cpu_bytes_to_use": 1024}
    assert load_vllm_config(json.dumps(inner)).given() == inner
    path = tmp_path / "kv.json"
    path.write_text(
        json.dumps({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": inner})
    )
    assert load_vllm_config(str(path)).given() == inner
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(InputError, match=r"bad\.json"):
        load_vllm_config(str(bad))
    with pytest.raises(InputError, match="JSON object"):
        load_vllm_config("[1, 2]")


def test_vllm_older_num_cpu_blocks_sizes_the_tier():
    opts = options_from_vllm_config({"num_cpu_blocks": 64, "block_size": 512})
    assert opts.resolve(512).num_chunks == 64
    with pytest.raises(InputError, match="not both"):
        options_from_vllm_config({"num_cpu_blocks": 64, "cpu_bytes_to_use": 2**30})


def test_the_config_deployed_into_vllm_maps_back_without_vllm():
    """The JSON docs/policies.md deploys into vLLM names kvsim's exported CachePolicy; fed back to
    kvsim it runs the kvsim policy itself, without importing vLLM or the adapter module."""
    import subprocess
    import sys

    code = (
        "import sys; from kvsim.policies.registry import eviction_policy_class as c; "
        "from kvsim.policies.s3fifo import S3FIFOPolicy; "
        "assert c('KvsimS3FIFO', 'kvsim.integrations.vllm') is S3FIFOPolicy; "
        "assert 'kvsim.integrations.vllm' not in sys.modules and 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
