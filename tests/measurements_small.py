"""A measurements file small enough for CI: Llama-2-7B on one H100, 10 s stages."""

from __future__ import annotations

import copy
from typing import Any

import yaml

EXPERIMENT: dict[str, Any] = {
    "id": "small-llama-2-7b",
    "source": "a shortened copy of a shared training experiment's setup",
    "model": "llama-2-7b",
    "gpu": "h100",
    "tp": 1,
    "vllm": {
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "max_model_len": 4096,
        "block_size": 16,
        "gpu_memory_utilization": 0.9,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "dtype": "float16",
        "num_gpu_blocks_override": 7463,
        "kv_transfer_config": {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 8589934592},
        },
    },
    "workload": {
        "type": "shared_prefix",
        "num_groups": 2,
        "num_prompts_per_group": 3,
        "system_prompt_len": 100,
        "question_len": 200,
        "output_len": 20,
        "ignore_eos": True,
    },
    "load": {
        "type": "constant",
        "stages": [{"rate": 4, "duration": 5}, {"rate": 8, "duration": 5}],
    },
    "measured": [
        {"stage": 0, "ttft_ms": {"mean": 20.0, "p90": 25.0}, "e2e_ms": {"mean": 200.0}},
        {
            "stage": "all",
            "ttft_ms": {"mean": 22.0, "p99": 40.0},
            "e2e_ms": {"mean": 210.0},
            "requests_per_s": 6.0,
            "output_len_mean": 18.0,
            "output_tokens_per_s": 108.0,
        },
    ],
}

#: vLLM without chunked prefill refuses a step budget below max_model_len: an experiment
#: that cannot have run as written
UNSTARTABLE = {
    **EXPERIMENT["vllm"],
    "enable_chunked_prefill": False,
    "max_num_batched_tokens": 2048,
    "max_model_len": 4096,
}


def experiment(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(EXPERIMENT)
    out.update(copy.deepcopy(changes))  # nothing shared: YAML would write an alias
    return out


def write(path: Any, *experiments: dict[str, Any], version: Any = 1) -> str:
    data = {"kvsim_measurements": version, "experiments": list(experiments) or [experiment()]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)
