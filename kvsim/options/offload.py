"""What a user asks of the CPU tier, described once: :class:`OffloadOptions` (a
:class:`kvsim.options.schema.Schema`), from which come the checks, the bounds, the help texts
of ``kvsim replay`` / ``simulate`` and the JSON Schema. It is resolved against a trace's
block size into a :class:`CacheConfig`, which is all the core ever sees.

vLLM's ``kv_connector_extra_config`` is translated into these options by
:mod:`kvsim.options.vllm`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta

from kvsim.core.errors import InputError
from kvsim.core.keys import KeyLayout
from kvsim.core.units import GIB
from kvsim.options.config import CacheConfig, resolve_admission
from kvsim.options.engine import MAX_GPU_BLOCKS
from kvsim.options.schema import Schema, check_fields
from kvsim.options.tiers import TierSpec, as_tier_specs

if TYPE_CHECKING:
    from kvsim.specs.models import ModelSpec
    from kvsim.specs.sizing import CPUTierSizing

__all__ = [
    "DEFAULT_MODEL",
    "OFFLOAD_FIELDS",
    "CacheConfig",
    "Count",
    "NonNegative",
    "OffloadOptions",
    "Text",
    "option_name",
    "resolve_admission",
]

DEFAULT_MODEL = "llama-3.1-8b"


def option_name(field: str) -> str:
    """How errors and the command line name an option field: ``cpu_gib`` -> ``--cpu-gib``
    (``cpu_bytes`` has no flag: vLLM's ``cpu_bytes_to_use`` gives it)."""
    return "cpu_bytes_to_use" if field == "cpu_bytes" else "--" + field.replace("_", "-")


#: the scalar kinds options are made of; a field adds its help text with another Meta
Count = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[int, Meta(ge=0)]
Text = Annotated[str, Meta(min_length=1)]


class OffloadOptions(Schema, frozen=True):
    """A user's offload request before the trace's block size is known: the CPU tier's
    size, its policies and the key layout (vLLM's names are aliases on the command line).

    Every field is checked when the value is built, with a one-line :class:`InputError`
    naming the option (``--cpu-gib: Expected `float` > 0.0, got 0``); the rules between
    fields (one size, a chunk of whole GPU blocks) when it is resolved. ``extra``: ``cli``
    False keeps a field off the command line, ``aliases`` are its other flags."""

    cpu_chunks: Annotated[Count, Meta(description="CPU tier capacity in chunks.")] | None = None
    cpu_gib: (
        Annotated[
            float,
            Meta(
                gt=0,
                description=(
                    "CPU tier size in GiB (vLLM's --kv-offloading-size: cpu_bytes_to_use / "
                    "2**30 over all TP workers), sized for --model."
                ),
                extra={"aliases": ["--kv-offloading-size"]},
            ),
        ]
        | None
    ) = None
    cpu_bytes: (
        Annotated[
            Count,
            Meta(
                description="CPU tier size in bytes (vLLM's cpu_bytes_to_use).",
                extra={"cli": False},
            ),
        ]
        | None
    ) = None
    model: (
        Annotated[
            Text,
            Meta(
                description=(
                    "Model preset (see `kvsim models`), its Hugging Face id "
                    "(meta-llama/Llama-3.1-8B-Instruct), or a Hugging Face config.json path, "
                    "for the KV bytes per token."
                ),
                extra={"metavar": "NAME|CONFIG.JSON"},
            ),
        ]
        | None
    ) = DEFAULT_MODEL
    chunk_tokens: (
        Annotated[
            Count,
            Meta(description="Tokens per CPU chunk (default: one trace block; vLLM block_size)."),
        ]
        | None
    ) = None
    block_tokens: (
        Annotated[
            Count,
            Meta(
                description=(
                    "Tokens per trace hash block (default: the trace format's, 512 for Mooncake)."
                )
            ),
        ]
        | None
    ) = None
    gpu_block_tokens: Annotated[
        Count,
        Meta(
            description=(
                "vLLM GPU block size (--block-size, default 16): sizes CPU chunks; in simulate "
                "also the GPU KV blocks."
            )
        ),
    ] = 16
    tp: Annotated[
        Count,
        Meta(
            description="Tensor-parallel world size for sizing (default 1).",
            extra={"aliases": ["--tensor-parallel-size"]},
        ),
    ] = 1
    gpu_blocks: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_GPU_BLOCKS,
            description=(
                "replay: GPU prefix-cache size in key-unit blocks, 0 (default) disables it; "
                "simulate: GPU KV capacity in --gpu-block-tokens blocks (vLLM "
                "num_gpu_blocks_override), default from GPU memory."
            ),
        ),
    ] = 0
    policy: Annotated[
        Text, Meta(description="Eviction policy: lru (default), arc, ... or module:Class.")
    ] = "lru"
    policy_module: (
        Annotated[
            Text,
            Meta(
                description="Module vLLM loads an eviction policy from (cache_policy_module_path).",
                extra={"cli": False},
            ),
        ]
        | None
    ) = None
    admission: Annotated[
        Text, Meta(description="Admission policy (default always; see `kvsim policies`).")
    ] = "always"
    store_threshold: Annotated[
        NonNegative,
        Meta(description="vLLM store_threshold: offers before a chunk is stored (>= 2 enables)."),
    ] = 0
    max_tracker_size: Annotated[
        Count,
        Meta(description="vLLM max_tracker_size of the threshold counter table (default 64000)."),
    ] = 64_000
    seed: Annotated[NonNegative, Meta(description="Seed for randomised policies (default 0).")] = 0
    prefill_chunk_tokens: (
        Annotated[
            Count,
            Meta(
                description=(
                    "Offer stores per chunked-prefill step of N tokens, as vLLM does (default: "
                    "one offer per request)."
                )
            ),
        ]
        | None
    ) = None
    kv_cache_dtype: Annotated[
        Text,
        Meta(
            description=(
                "vLLM's KV cache dtype: auto (the model's, default), bfloat16, float16, fp8, "
                "fp8_e4m3, fp8_e5m2, fp8_inc; fp8 halves the KV bytes per token."
            ),
            extra={"metavar": "DTYPE"},
        ),
    ] = "auto"
    secondary_tiers: Annotated[
        tuple[Any, ...],
        Meta(
            description=(
                "Tiers behind the CPU tier, as vLLM's TieringOffloadingSpec secondary_tiers "
                'objects (e.g. [{"type": "fs"}], see kvsim.options.tiers).'
            ),
            extra={"cli": False},
        ),
    ] = ()

    def __post_init__(self) -> None:
        check_fields(self, names=option_name)
        tiers = self.secondary_tiers
        if not (isinstance(tiers, tuple) and all(isinstance(t, TierSpec) for t in tiers)):
            msgspec.structs.force_setattr(self, "secondary_tiers", as_tier_specs(tiers))

    def resolve(self, trace_block_tokens: int, model: ModelSpec | None = None) -> CacheConfig:
        """The run's configuration for a trace of ``trace_block_tokens``-token blocks; the
        rules between options are checked here, with a one-line :class:`InputError`.

        Args:
            trace_block_tokens: the trace's block size.
            model: these options' model, already resolved (a previous configuration's
                ``model_spec``), so that resolving again at other sizes looks no name up;
                None: looked up here, once.
        """
        block_tokens = self.block_tokens or trace_block_tokens
        chunk_tokens = self.chunk_tokens or block_tokens
        KeyLayout(block_tokens, chunk_tokens)  # validates the pair
        if self.secondary_tiers and resolve_admission(self.admission, self.store_threshold) != (
            "always"
        ):
            raise InputError(
                "secondary tiers admit every chunk: drop --admission / --store-threshold "
                "(vLLM's TieringOffloadingSpec refuses store_threshold)"
            )
        self._check_one_size()
        spec = self.model_spec() if model is None else model
        chunk_bytes = None if spec is None else self._sizing(spec, chunk_tokens, 0).raw_chunk_bytes
        return CacheConfig(
            num_chunks=self._num_chunks(spec, chunk_tokens),
            block_tokens=block_tokens,
            chunk_tokens=chunk_tokens,
            gpu_blocks=self.gpu_blocks,
            policy=self.policy,
            policy_module=self.policy_module,
            admission=self.admission,
            store_threshold=self.store_threshold,
            max_tracker_size=self.max_tracker_size,
            chunk_bytes=chunk_bytes,
            model=self.model,
            seed=self.seed,
            prefill_chunk_tokens=self.prefill_chunk_tokens,
            kv_cache_dtype=self.kv_cache_dtype.strip().lower(),
            secondary_tiers=self.secondary_tiers,
            model_spec=spec,
        )

    # --- resolve's steps, in the order their errors are reported ---

    def _check_one_size(self) -> None:
        """Exactly one of the three ways to size the CPU tier."""
        given = [
            option_name(n)
            for n in ("cpu_chunks", "cpu_gib", "cpu_bytes")
            if getattr(self, n) is not None
        ]
        if not given:
            raise InputError(
                "give the CPU tier size: --cpu-chunks N, or --cpu-gib X with --model M"
            )
        if len(given) > 1:
            raise InputError(f"give only one CPU tier size, got {' and '.join(given)}")

    def model_spec(self) -> ModelSpec | None:
        """The model (a preset or a ``config.json``) with its KV cache in
        ``kv_cache_dtype``, looked up once; None without ``--model``."""
        from kvsim.specs.models import get_model, kv_dtype_bytes

        kv_dtype_bytes(self.kv_cache_dtype)  # checked with or without a model
        if not self.model:
            return None
        try:
            spec = get_model(self.model)
        except InputError as exc:
            raise InputError(f"--model: {exc}") from None
        spec.kv_heads_per_worker(self.tp)  # a tp vLLM would refuse, named as --tp
        return spec.with_kv_cache_dtype(self.kv_cache_dtype)

    def _num_chunks(self, spec: ModelSpec | None, chunk_tokens: int) -> int:
        """The CPU tier's size in chunks, from whichever size was given."""
        if self.cpu_chunks is not None:
            return self.cpu_chunks
        if spec is None:
            raise InputError("--cpu-gib needs --model to know the bytes per chunk")
        if self.cpu_bytes is not None:
            cpu_bytes, option = self.cpu_bytes, "cpu_bytes_to_use"
        else:
            assert self.cpu_gib is not None  # _check_one_size saw one size
            as_float = self.cpu_gib * GIB  # past any trace is fine (the ceiling), but a
            # size near 1e300 GiB is no float of bytes: then counted exactly
            cpu_bytes = int(as_float) if math.isfinite(as_float) else int(self.cpu_gib) * GIB
            option = "--cpu-gib"
        return self._sizing(spec, chunk_tokens, cpu_bytes, option).num_chunks

    def _sizing(
        self, spec: ModelSpec, chunk_tokens: int, cpu_bytes: int, option: str = "--cpu-gib"
    ) -> CPUTierSizing:
        from kvsim.specs.sizing import size_for_model

        if chunk_tokens % self.gpu_block_tokens:
            chunk = (  # given, or the trace's block size (what a chunk defaults to)
                f"--chunk-tokens {chunk_tokens}"
                if self.chunk_tokens
                else f"the chunk ({chunk_tokens} tokens: the trace's blocks, as no "
                "--chunk-tokens is given)"
            )
            raise InputError(
                f"{chunk} must be a multiple of the GPU block size "
                f"{self.gpu_block_tokens} (vLLM chunks are whole GPU blocks; "
                "--gpu-block-tokens sets it)"
            )
        try:
            return size_for_model(
                spec,
                cpu_bytes,
                gpu_block_tokens=self.gpu_block_tokens,
                blocks_per_chunk=chunk_tokens // self.gpu_block_tokens,
                tp=self.tp,
                require_one_chunk=cpu_bytes > 0,
            )
        except InputError as exc:
            msg = str(exc)
            raise InputError(msg if msg.startswith(option) else f"{option}: {msg}") from None


#: every option's field name, in declaration order (the API's keywords, the sweep's options)
OFFLOAD_FIELDS: tuple[str, ...] = OffloadOptions.__struct_fields__
