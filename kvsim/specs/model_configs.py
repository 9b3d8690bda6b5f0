"""The published Hugging Face ``config.json`` fields of the presets that come from one.

Each entry is the subset of the model's own ``config.json`` that sizing and the step-time
model read (the same reader as ``--model config.json``: :mod:`kvsim.specs.hf_config`), so a
preset and the file give the same spec. The repository each comes from is in ``SOURCES``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HF_CONFIGS", "SOURCES"]

_LLAMA2 = {"vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "float16"}
_MIXTRAL = {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None}

HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {
        **_LLAMA2,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
    },
    "llama-2-70b": {
        **_LLAMA2,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
    },
    "codellama-34b": {
        "vocab_size": 32000,
        "max_position_embeddings": 16384,
        "torch_dtype": "bfloat16",
        "hidden_size": 8192,
        "intermediate_size": 22016,
        "num_hidden_layers": 48,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
    },
    "qwen3-14b": {
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
        "sliding_window": None,
        "use_sliding_window": False,
    },
    "qwen3-32b": {
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
        "sliding_window": None,
        "use_sliding_window": False,
    },
    "mixtral-8x7b": {
        **_MIXTRAL,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "mixtral-8x22b": {
        **_MIXTRAL,
        "vocab_size": 32768,
        "max_position_embeddings": 65536,
        "torch_dtype": "bfloat16",
        "hidden_size": 6144,
        "intermediate_size": 16384,
        "num_hidden_layers": 56,
        "num_attention_heads": 48,
        "num_key_value_heads": 8,
    },
    "gpt-oss-120b": {
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "tie_word_embeddings": False,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
        "quantization_config": {"quant_method": "mxfp4"},
    },
}

SOURCES: dict[str, str] = {
    "llama-2-7b": "huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json",
    "llama-2-70b": "huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json",
    "codellama-34b": "huggingface.co/codellama/CodeLlama-34b-hf/blob/main/config.json",
    "qwen3-14b": "huggingface.co/Qwen/Qwen3-14B/blob/main/config.json",
    "qwen3-32b": "huggingface.co/Qwen/Qwen3-32B/blob/main/config.json",
    "mixtral-8x7b": "huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
    # the Instruct model's file: its vocabulary is 32768 (tokenizer v3); the base
    # Mixtral-8x22B-v0.1's config.json says 32000, otherwise the same (9.4 M parameters less)
    "mixtral-8x22b": "huggingface.co/mistralai/Mixtral-8x22B-Instruct-v0.1/blob/main/config.json",
    "gpt-oss-120b": "huggingface.co/openai/gpt-oss-120b/blob/main/config.json",
}
