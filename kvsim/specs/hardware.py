"""GPU presets for the timed simulator: compute roofline figures, memory, and host link.

Peak FLOP/s are dense BF16 tensor-core figures from the vendors' data sheets; memory is
what ``nvidia-smi`` reports; ``link`` names a preset of
:mod:`kvsim.engine.transfer_model`. The figures are starting points: a compute or transfer
profile measured on the real machine replaces them.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from kvsim.core.errors import InputError, did_you_mean
from kvsim.core.units import GIB
from kvsim.options.schema import Schema, check_fields, load

MIB = 2**20


#: the host-link presets a GPU can name: kvsim.engine.transfer_model.LINK_PRESETS' keys
#: (listed here because the engine sits layers above; a test keeps the two equal)
LINKS = ("pcie5", "pcie4", "gh200")
_Rate = Annotated[float, Meta(gt=0)]


class GpuSpec(Schema, frozen=True, kw_only=False):
    """One GPU type's roofline figures, memory and host link (what the timed engine models);
    also the GPU spec JSON a user writes for a GPU without a preset (:func:`load_gpu_spec`)."""

    name: Annotated[str, Meta(min_length=1, pattern=r"\S", description="The GPU's name.")]
    peak_flops: Annotated[_Rate, Meta(description="Dense BF16 tensor FLOP/s.")]
    hbm_bytes_per_s: Annotated[_Rate, Meta(description="HBM bandwidth, bytes/s.")]
    memory_bytes: Annotated[
        Annotated[int, Meta(gt=0)] | _Rate,
        Meta(description="GPU memory in bytes (what nvidia-smi reports)."),
    ]
    link: Annotated[
        Literal["pcie5", "pcie4", "gh200"],
        Meta(description="The host link preset (kvsim.engine.transfer_model.LINK_PRESETS)."),
    ]

    def __post_init__(self) -> None:
        check_fields(self)
        if isinstance(self.memory_bytes, float):
            msgspec.structs.force_setattr(self, "memory_bytes", int(self.memory_bytes))


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


def vllm_default_batched_tokens(
    gpu: GpuSpec, max_model_len: int | None, chunked: bool, max_num_seqs: int | None = None
) -> int:
    """``max_num_batched_tokens`` when none is given, as ``vllm serve`` 0.33 sets it
    (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``): the GPU's default
    (:func:`vllm_batch_defaults`); without chunked prefill raised to ``max_model_len`` (a
    prompt must fit one step); then, chunked or not, at most ``max_num_seqs x
    max_model_len`` (no step can hold more; it binds only with a short ``max_model_len``).

    Args:
        max_model_len: the engine's (None: unknown, the GPU's default stands).
        chunked: ``enable_chunked_prefill``.
        max_num_seqs: the engine's (None: the GPU's default).
    """
    tokens, seqs = vllm_batch_defaults(gpu)
    if not max_model_len:
        return tokens
    if not chunked:
        tokens = max(max_model_len, tokens)
    return min((max_num_seqs or seqs) * max_model_len, tokens)


#: words that may follow a preset's name in the GPU's product name (``nvidia-smi``'s "NVIDIA
#: H100 80GB HBM3", "NVIDIA A100-SXM4-80GB") and still name the part the preset's figures are;
#: any other ("PCIe", "NVL", "40GB") is a part whose bandwidth or memory differs
_PRESET_PARTS: dict[str, frozenset[str]] = {
    "h100": frozenset({"sxm", "sxm5", "80gb", "hbm3"}),
    "h200": frozenset({"sxm", "sxm5", "141gb", "hbm3e"}),
    "a100": frozenset({"sxm", "sxm4", "80gb"}),
    "l40s": frozenset({"48gb"}),
    "gh200": frozenset({"96gb", "480gb", "hbm3"}),
    "b200": frozenset({"sxm", "180gb", "192gb", "hbm3e"}),
}


def preset_of_gpu_name(name: str) -> str | None:
    """The preset a GPU's product name written out names ("NVIDIA H100 80GB HBM3",
    "H100-80GB", "A100-SXM4-80GB"), or None: a measurements file transcribed from a
    benchmark's report names the GPU so, and another variant (PCIe, NVL, 40GB) is not
    taken for the preset, whose figures it does not have."""
    import re

    text = re.sub(r"(\d+)\s*gb\b", r"\1gb", name.strip().lower())
    words = [w for w in re.split(r"[\s_/-]+", text) if w]
    if words[:1] == ["nvidia"]:
        words = words[1:]
    if not words or words[0] not in _PRESET_PARTS:
        return None
    return words[0] if set(words[1:]) <= _PRESET_PARTS[words[0]] else None


def get_gpu(name: str | os.PathLike[str]) -> GpuSpec:
    """A preset by name (or by the product name it stands for, :func:`preset_of_gpu_name`),
    or a GPU spec JSON file (:func:`load_gpu_spec`) by path."""
    text = os.fspath(name)
    key = str(text).strip().lower()
    if key in GPUS:
        return GPUS[key]
    if os.path.exists(text):
        return load_gpu_spec(text)
    preset = preset_of_gpu_name(str(text))
    if preset is not None:
        return GPUS[preset]
    if key.endswith(".json"):  # a file meant, not a name: say it is missing
        raise InputError(f"{text}: no such file (a GPU spec JSON path)")
    raise InputError(
        f"unknown GPU {name!r}{did_you_mean(text, GPUS)}; known: {', '.join(GPUS)}, "
        "or a GPU spec JSON path"
    )


def load_gpu_spec(path: str | os.PathLike[str]) -> GpuSpec:
    """A GPU without a preset, from a JSON object with exactly :class:`GpuSpec`'s fields,
    e.g. ``{"name": "b300", "peak_flops": 2.5e15, "hbm_bytes_per_s": 8e12,
    "memory_bytes": 288e9, "link": "pcie5"}``; each is checked, with a one-line error
    naming the file and the key (``kvsim schema gpu-spec`` prints the JSON Schema)."""
    from kvsim.core.io import read_json

    source = os.fspath(path)
    data = read_json(source)
    if isinstance(data, dict):  # names as kvsim spells them: trimmed, the link in lower case
        data = {k: v.strip() if k == "name" and isinstance(v, str) else v for k, v in data.items()}
        if isinstance(data.get("link"), str):
            data["link"] = data["link"].strip().lower()
    return load(GpuSpec, data, source=source)
