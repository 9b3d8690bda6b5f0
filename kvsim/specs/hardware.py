"""GPU presets for the timed simulator: compute roofline figures, memory, and host link.

Peak FLOP/s are dense BF16 tensor-core figures from the vendors' data sheets; memory is
what ``nvidia-smi`` reports; ``link`` names a preset of
:mod:`kvsim.engine.transfer_model`. The figures are starting points: a compute or transfer
profile measured on the real machine replaces them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

from kvsim.core.errors import InputError
from kvsim.core.units import GIB

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
        # B200 (HGX, 1000 W): NVIDIA's HGX B200 datasheet gives FP16/BF16 tensor 4.5 PFLOPS
        # with sparsity (2.25 dense) and 8 TB/s HBM3e; nvidia-smi reports 183359 MiB
        # (NVIDIA/TensorRT-LLM issue #10278). The GPU has PCIe Gen6, but HGX B200 hosts
        # (DGX B200: Intel Xeon Platinum 8570) are PCIe Gen5 x16 to the CPU, so the host
        # link is pcie5 -- an assumption; a calibration profile (--link) replaces it.
        GpuSpec("b200", 2250e12, 8.0e12, 183359 * MIB, "pcie5"),
    )
}


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


def get_gpu(name: str | os.PathLike[str]) -> GpuSpec:
    """A preset by name, or a GPU spec JSON file (:func:`load_gpu_spec`) by path."""
    text = os.fspath(name)
    key = str(text).strip().lower()
    if key in GPUS:
        return GPUS[key]
    if os.path.exists(text):
        return load_gpu_spec(text)
    raise InputError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}, or a GPU spec JSON path")


_NUMBER_FIELDS = ("peak_flops", "hbm_bytes_per_s", "memory_bytes")
#: the host-link presets a GPU can name: kvsim.engine.transfer_model.LINK_PRESETS' keys
#: (listed here because the engine sits layers above; a test keeps the two equal)
LINKS = ("pcie5", "pcie4", "gh200")


def load_gpu_spec(path: str | os.PathLike[str]) -> GpuSpec:
    """A GPU without a preset, from a JSON object with exactly :class:`GpuSpec`'s fields,
    e.g. ``{"name": "b300", "peak_flops": 2.5e15, "hbm_bytes_per_s": 8e12,
    "memory_bytes": 288e9, "link": "pcie5"}``; each is checked, with a one-line error
    naming the file and the key."""
    from kvsim.core.io import read_json

    source = os.fspath(path)
    data = read_json(source)
    if not isinstance(data, dict):
        raise InputError("a GPU spec must be a JSON object", source=source)
    names = [f.name for f in fields(GpuSpec)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise InputError(
            f"unknown key(s) {', '.join(unknown)}; a GPU spec has {', '.join(names)}",
            source=source,
        )
    missing = [n for n in names if n not in data]
    if missing:
        raise InputError(f"missing key(s) {', '.join(missing)}", source=source)
    for key in ("name", "link"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise InputError(f"{key} must be a non-empty string, got {data[key]!r}", source=source)
    for key in _NUMBER_FIELDS:
        value = data[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (ok and math.isfinite(value) and value > 0):
            raise InputError(f"{key} must be a finite number > 0, got {value!r}", source=source)
    link = data["link"].strip().lower()
    if link not in LINKS:
        raise InputError(
            f"link must be a link preset ({', '.join(LINKS)}), got {data['link']!r}",
            source=source,
        )
    return GpuSpec(
        name=data["name"].strip(),
        peak_flops=float(data["peak_flops"]),
        hbm_bytes_per_s=float(data["hbm_bytes_per_s"]),
        memory_bytes=int(data["memory_bytes"]),
        link=link,
    )
