"""The ``max_model_len`` kvsim derives from a Hugging Face ``config.json``
(:func:`kvsim.specs.hf_config.max_model_lens`, read by ``get_model``) against vLLM 0.33's own
derivation, driven on CPU: transformers builds the config, vLLM patches its RoPE parameters
and derives the length (``derive_max_model_len_and_key``, ``_get_and_verify_max_len``), as
``vllm serve`` does. For each config: the length vLLM takes when none is given, and the
boundary of what it starts with (the longest it takes, one more refused). Skipped without
vLLM (failed under ``KVSIM_REQUIRE_VLLM=1``)."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest
from support import need_vllm

need_vllm("vllm.config.model")

from transformers import AutoConfig, PretrainedConfig  # noqa: E402
from vllm.config.model import _get_and_verify_max_len  # noqa: E402
from vllm.transformers_utils.config import (  # noqa: E402
    get_hf_text_config,
    patch_rope_parameters,
)
from vllm.transformers_utils.model_arch_config_convertor import (  # noqa: E402
    ModelArchConfigConvertorBase,
)

from kvsim.core.errors import InputError  # noqa: E402
from kvsim.specs.context import engine_max_model_len, vllm_max_model_len  # noqa: E402
from kvsim.specs.models import get_model  # noqa: E402

pytestmark = pytest.mark.vllm

SHAPES = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
LLAMA = {"model_type": "llama", **SHAPES, "max_position_embeddings": 4096}
FACTORS = {"long_factor": [1.0] * 8, "short_factor": [1.0] * 8}

CONFIGS: dict[str, dict[str, Any]] = {
    "plain": LLAMA,
    "linear, legacy type key": {**LLAMA, "rope_scaling": {"type": "linear", "factor": 4.0}},
    "dynamic": {**LLAMA, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "llama3 (already scaled)": {
        **LLAMA,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    },
    "yarn (already scaled)": {
        **LLAMA,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    },
    "longrope, original length at the top level": {
        **LLAMA,
        "original_max_position_embeddings": 1024,
        "rope_scaling": {"rope_type": "longrope", **FACTORS},
    },
    "longrope, original length in the RoPE parameters": {
        **LLAMA,
        "rope_scaling": {
            "rope_type": "longrope",
            **FACTORS,
            "original_max_position_embeddings": 1024,
        },
    },
    "n_positions below max_position_embeddings": {**LLAMA, "n_positions": 1000},
    "seq_length below": {**LLAMA, "seq_length": 3000},
    "model_max_length overrides": {**LLAMA, "model_max_length": 9000},
    "gemma3: its RoPE factor already applied, nested by layer type": {
        "model_type": "gemma3_text",
        **SHAPES,
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    },
    "no length key: vLLM assumes 2048": {"model_type": None, **SHAPES},
}


def vllm_derives(config: dict[str, Any], given: int | None) -> int:
    """The ``max_model_len`` vLLM 0.33 starts with for ``config`` and ``--max-model-len
    given`` (ValueError where it refuses to start)."""
    kwargs = copy.deepcopy(config)  # transformers writes into the RoPE mapping it is given
    model_type = kwargs.pop("model_type")
    hf = (
        PretrainedConfig(**kwargs)
        if model_type is None
        else AutoConfig.for_model(model_type, **kwargs)
    )
    patch_rope_parameters(hf)
    text = get_hf_text_config(hf)
    convertor = ModelArchConfigConvertorBase(hf, text)
    arch = SimpleNamespace(derived_max_model_len_and_key=convertor.derive_max_model_len_and_key())
    return _get_and_verify_max_len(
        hf_config=text,
        model_arch_config=arch,
        tokenizer_config=None,
        max_model_len=given,
        disable_sliding_window=False,
        sliding_window=None,
    )


def vllm_starts(config: dict[str, Any], given: int) -> bool:
    try:
        vllm_derives(config, given)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_length_kvsim_reads_from_a_config_is_vllms(name, tmp_path):
    config = CONFIGS[name]
    file = tmp_path / "config.json"
    file.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    spec = get_model(str(file))

    default = vllm_derives(config, None)
    assert engine_max_model_len(spec, None) == default
    assert vllm_max_model_len(spec, None, "--max-model-len") == default

    longest = spec.derived_max_model_len
    if not longest:  # no length in the config: any length given starts
        assert vllm_starts(config, 10**7)
        assert vllm_max_model_len(spec, 10**7, "--max-model-len") == 10**7
        return
    assert vllm_starts(config, longest)
    assert not vllm_starts(config, longest + 1)
    assert vllm_max_model_len(spec, longest, "--max-model-len") == longest
    with pytest.raises(InputError, match="--max-model-len"):
        vllm_max_model_len(spec, longest + 1, "--max-model-len")


def test_the_cases_reach_each_rule():
    """The configs above differ where the rules do: a stretched length, a default below the
    longest, the assumed length, a key below max_position_embeddings, an override."""
    derived = {name: vllm_derives(config, None) for name, config in CONFIGS.items()}
    assert derived["linear, legacy type key"] == 16384
    assert derived["dynamic"] == 8192
    assert derived["longrope, original length at the top level"] == 1024
    assert derived["no length key: vLLM assumes 2048"] == 2048
    assert derived["n_positions below max_position_embeddings"] == 1000
    assert derived["model_max_length overrides"] == 9000
    assert derived["gemma3: its RoPE factor already applied, nested by layer type"] == 4096
