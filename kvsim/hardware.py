"""GPU presets for the timed simulator: compute roofline figures, memory, and host link.

Peak FLOP/s are dense BF16 tensor-core figures from the vendors' data sheets; memory is
what ``nvidia-smi`` reports; ``link`` names a preset of
:mod:`kvsim.engine.transfer_model`. The figures are starting points: a compute or transfer
profile measured on the real machine replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import InputError

MIB = 2**20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type's roofline figures, memory and host link (what the timed engine models)."""

    name: str
    peak_flops: float  # dense BF16 FLOP/s
    hbm_bytes_per_s: float
    memory_bytes: int
    link: str  # transfer_model.LINK_PRESETS key


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("h100", 989e12, 3.35e12, 81559 * MIB, "pcie5"),
        GpuSpec("h200", 989e12, 4.8e12, 143771 * MIB, "pcie5"),
        GpuSpec("a100", 312e12, 2.039e12, 81920 * MIB, "pcie4"),
        GpuSpec("l40s", 362e12, 0.864e12, 46068 * MIB, "pcie4"),
        GpuSpec("gh200", 989e12, 4.0e12, 97871 * MIB, "gh200"),
    )
}


GIB = 1 << 30


def vllm_batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm serve`` 0.33 picks on ``gpu``.

    vLLM's ``EngineArgs.get_batch_defaults`` for the OpenAI server: >= 160 GiB GPUs get
    16384 / 1024; >= 70 GiB ones other than the A100 get 8192 / 1024; the rest 2048 / 256.
    """
    if gpu.memory_bytes >= 160 * GIB:
        return 16384, 1024
    if gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name:
        return 8192, 1024
    return 2048, 256


def get_gpu(name: str) -> GpuSpec:
    key = str(name).strip().lower()
    try:
        return GPUS[key]
    except KeyError:
        raise InputError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None
