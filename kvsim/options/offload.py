"""Run configuration: frozen dataclasses validated once, at the edge.

``OffloadOptions`` is what a user asks for (CLI options, API keywords, or vLLM's
``kv_connector_extra_config`` translated by :func:`options_from_vllm_config`); it is
resolved against a trace's block size into a :class:`CacheConfig`, which is all the core
ever sees.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from kvsim.core.errors import InputError
from kvsim.core.io import parse_json, read_json
from kvsim.core.keys import KeyLayout
from kvsim.core.units import GIB
from kvsim.options.tiers import TIERING_SPEC_NAME, TierSpec, as_tier_specs, parse_secondary_tiers

if TYPE_CHECKING:
    from kvsim.specs.models import ModelSpec
    from kvsim.specs.sizing import CPUTierSizing

DEFAULT_MODEL = "llama-3.1-8b"

_Number = TypeVar("_Number", int, float)

# vLLM kv_connector_extra_config keys: those kvsim models, and those it accepts and ignores.
_VLLM_USED = {
    "cpu_bytes_to_use",
    "num_cpu_blocks",
    "block_size",
    "blocks_per_chunk",
    "eviction_policy",
    "cache_policy_module_path",
    "store_threshold",
    "max_tracker_size",
    "secondary_tiers",  # TieringOffloadingSpec (kvsim.options.tiers)
    "backpressure",
}
_VLLM_IGNORED = {
    "tier_poll_interval_s",  # a thread for peer tiers, which kvsim does not run
    "spec_name",
    "spec_module_path",
    "offload_prompt_only",
    "sync_load_budget_bytes",
    "self_describing_kv_events",
    "canonical_layout",
}


def resolve_admission(admission: str, store_threshold: int) -> str:
    """The admission rule a run uses: vLLM's ``store_threshold >= 2`` turns the default
    ``always`` into the threshold rule. The one place that decides it."""
    if admission.lower() == "always" and store_threshold >= 2:
        return "threshold"
    return admission


@dataclass(frozen=True)
class CacheConfig:
    """Everything cache-mode replay needs, resolved and validated."""

    num_chunks: int
    block_tokens: int
    chunk_tokens: int
    gpu_blocks: int = 0
    policy: str = "lru"
    policy_module: str | None = None
    admission: str = "always"
    store_threshold: int = 0
    max_tracker_size: int = 64_000
    chunk_bytes: int | None = None
    model: str | None = None
    seed: int = 0
    prefill_chunk_tokens: int | None = None
    kv_cache_dtype: str = "auto"  # vLLM --kv-cache-dtype the chunk bytes were sized with
    secondary_tiers: tuple[TierSpec, ...] = ()  # behind the CPU tier (kvsim.tiering)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "admission", resolve_admission(self.admission, self.store_threshold)
        )

    @property
    def layout(self) -> KeyLayout:
        return KeyLayout(self.block_tokens, self.chunk_tokens)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: option -> (kind, smallest value, may be None); checked before any arithmetic, so a typo
#: (``cpu_gib="abc"``) is one line, not a 6 GB string or a traceback
_OPTION_RULES: dict[str, tuple[str, float, bool]] = {
    "cpu_chunks": ("int", 1, True),
    "cpu_gib": ("number", 0, True),
    "cpu_bytes": ("int", 1, True),
    "chunk_tokens": ("int", 1, True),
    "block_tokens": ("int", 1, True),
    "gpu_block_tokens": ("int", 1, False),
    "tp": ("int", 1, False),
    "gpu_blocks": ("int", 0, False),
    "store_threshold": ("int", 0, False),
    "max_tracker_size": ("int", 1, False),
    "seed": ("int", -math.inf, False),
    "prefill_chunk_tokens": ("int", 1, True),
    "model": ("text", 0, True),
    "kv_cache_dtype": ("text", 0, False),
    "policy": ("text", 0, False),
    "policy_module": ("text", 0, True),
    "admission": ("text", 0, False),
}


def _option_name(field: str) -> str:
    return "cpu_bytes_to_use" if field == "cpu_bytes" else "--" + field.replace("_", "-")


def _check_option_types(opts: OffloadOptions) -> None:
    for field, (kind, low, optional) in _OPTION_RULES.items():
        value = getattr(opts, field)
        if value is None and optional:
            continue
        name = _option_name(field)
        if kind == "text":
            if not isinstance(value, str):
                hint = " (a name or 'module:Class', not a class)" if field == "policy" else ""
                raise InputError(f"{name} must be text{hint}, got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise InputError(f"{name} must be a number, got {value!r}")
        if kind == "int" and not isinstance(value, numbers.Integral):
            raise InputError(f"{name} must be a whole number, got {value!r}")
        if not math.isfinite(value):
            raise InputError(f"{name} must be finite, got {value!r}")
        if value < low or (field == "cpu_gib" and value <= 0):
            bound = "> 0" if field == "cpu_gib" else f">= {low:g}"
            raise InputError(f"{name} must be {bound}, got {value!r}")


@dataclass(frozen=True)
class OffloadOptions:
    """A user's offload request before the trace's block size is known."""

    cpu_chunks: int | None = None
    cpu_gib: float | None = None
    cpu_bytes: int | None = None
    model: str | None = DEFAULT_MODEL
    chunk_tokens: int | None = None
    block_tokens: int | None = None
    gpu_block_tokens: int = 16
    tp: int = 1
    gpu_blocks: int = 0
    policy: str = "lru"
    policy_module: str | None = None
    admission: str = "always"
    store_threshold: int = 0
    max_tracker_size: int = 64_000
    seed: int = 0
    prefill_chunk_tokens: int | None = None
    kv_cache_dtype: str = "auto"  # vLLM --kv-cache-dtype: fp8 halves the KV bytes per token
    secondary_tiers: tuple[TierSpec, ...] = ()  # vLLM's TieringOffloadingSpec tiers

    def __post_init__(self) -> None:
        _check_option_types(self)
        object.__setattr__(self, "secondary_tiers", as_tier_specs(self.secondary_tiers))

    def with_(self, **changes: Any) -> OffloadOptions:
        return replace(self, **changes)

    def resolve(self, trace_block_tokens: int) -> CacheConfig:
        """The run's configuration for a trace of ``trace_block_tokens``-token blocks; every
        option is checked here, with a one-line :class:`InputError`."""
        block_tokens = self.block_tokens or trace_block_tokens
        chunk_tokens = self.chunk_tokens or block_tokens
        KeyLayout(block_tokens, chunk_tokens)  # validates the pair
        self._check_limits()
        self._check_one_size()
        spec = self.model_spec()
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
        )

    # --- resolve's steps, in the order their errors are reported ---

    def _check_limits(self) -> None:
        if self.gpu_blocks < 0:
            raise InputError(f"--gpu-blocks must be >= 0, got {self.gpu_blocks}")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise InputError(
                f"--prefill-chunk-tokens must be >= 1, got {self.prefill_chunk_tokens}"
            )
        if self.store_threshold < 0:
            raise InputError(f"--store-threshold must be >= 0, got {self.store_threshold}")
        if self.max_tracker_size < 1:
            raise InputError(f"--max-tracker-size must be >= 1, got {self.max_tracker_size}")
        admission = resolve_admission(self.admission, self.store_threshold)
        if self.secondary_tiers and admission != "always":
            raise InputError(
                "secondary tiers admit every chunk: drop --admission / --store-threshold "
                "(vLLM's TieringOffloadingSpec refuses store_threshold)"
            )

    def _check_one_size(self) -> None:
        """Exactly one of the three ways to size the CPU tier."""
        given = [
            n
            for n, v in (
                ("--cpu-chunks", self.cpu_chunks),
                ("--cpu-gib", self.cpu_gib),
                ("cpu_bytes_to_use", self.cpu_bytes),
            )
            if v is not None
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
        return spec.with_kv_cache_dtype(self.kv_cache_dtype)

    def _num_chunks(self, spec: ModelSpec | None, chunk_tokens: int) -> int:
        """The CPU tier's size in chunks, from whichever size was given."""
        if self.cpu_chunks is not None:
            if self.cpu_chunks < 1:
                raise InputError(f"--cpu-chunks must be >= 1, got {self.cpu_chunks}")
            return self.cpu_chunks
        if spec is None:
            raise InputError("--cpu-gib needs --model to know the bytes per chunk")
        if self.cpu_bytes is not None:
            cpu_bytes, option = self.cpu_bytes, "cpu_bytes_to_use"
        elif self.cpu_gib is not None:
            cpu_bytes, option = int(self.cpu_gib * GIB), "--cpu-gib"
        else:
            raise AssertionError("no CPU tier size although _check_one_size saw one")
        if cpu_bytes <= 0:
            raise InputError(f"{option} must be positive, got {self.cpu_gib or cpu_bytes}")
        return self._sizing(spec, chunk_tokens, cpu_bytes, option).num_chunks

    def _sizing(
        self, spec: ModelSpec, chunk_tokens: int, cpu_bytes: int, option: str = "--cpu-gib"
    ) -> CPUTierSizing:
        from kvsim.specs.sizing import size_for_model

        if chunk_tokens % self.gpu_block_tokens:
            raise InputError(
                f"--chunk-tokens {chunk_tokens} must be a multiple of the GPU block size "
                f"{self.gpu_block_tokens} (vLLM chunks are whole GPU blocks)"
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


def load_vllm_config(text_or_path: str) -> dict[str, Any]:
    """Parse ``--vllm-config``: inline JSON, or a JSON file; either the extra config itself
    or a full ``--kv-transfer-config`` object holding ``kv_connector_extra_config``."""
    source = "--vllm-config"
    if os.path.exists(text_or_path):
        source = text_or_path
        data = read_json(text_or_path)
    else:
        if text_or_path.lstrip()[:1] not in ("{", "["):  # meant as a path, not inline JSON
            raise InputError("no such file (and not inline JSON)", source=text_or_path)
        data = parse_json(text_or_path, source)
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", source=source)
    if "kv_connector_extra_config" in data:
        data = data["kv_connector_extra_config"]
        if not isinstance(data, dict):
            raise InputError("kv_connector_extra_config must be an object", source=source)
    return data


def options_from_vllm_config(
    extra: dict[str, Any], base: OffloadOptions | None = None
) -> OffloadOptions:
    """Translate vLLM's ``kv_connector_extra_config`` into kvsim options (vLLM's defaults)."""
    unknown = sorted(set(extra) - _VLLM_USED - _VLLM_IGNORED)
    if unknown:
        raise InputError(f"--vllm-config: unknown key(s) {', '.join(unknown)}")
    opts = base or OffloadOptions()
    changes: dict[str, Any] = {}
    if "cpu_bytes_to_use" in extra and "num_cpu_blocks" in extra:
        raise InputError("--vllm-config: give cpu_bytes_to_use or num_cpu_blocks, not both")
    if "cpu_bytes_to_use" in extra:
        changes.update(
            cpu_bytes=int(_vllm_number(extra, "cpu_bytes_to_use", float)),
            cpu_chunks=None,
            cpu_gib=None,
        )
    if "num_cpu_blocks" in extra:  # vLLM 0.11's key: the CPU tier's size in offloaded blocks
        changes.update(
            cpu_chunks=_vllm_number(extra, "num_cpu_blocks", int), cpu_bytes=None, cpu_gib=None
        )
    changes["chunk_tokens"] = _vllm_chunk_tokens(extra, opts.gpu_block_tokens)
    if "eviction_policy" in extra:
        changes["policy"] = str(extra["eviction_policy"])
    if "cache_policy_module_path" in extra:
        changes["policy_module"] = str(extra["cache_policy_module_path"])
    for key in ("store_threshold", "max_tracker_size"):
        if key in extra:
            changes[key] = _vllm_number(extra, key, int)
    if extra.get("spec_name") == TIERING_SPEC_NAME and changes.get("store_threshold", 0) >= 2:
        raise InputError(f"--vllm-config: store_threshold is not supported for {TIERING_SPEC_NAME}")
    changes["secondary_tiers"] = parse_secondary_tiers(extra)
    return opts.with_(**changes)


def engine_knobs_from_vllm_config(extra: dict[str, Any]) -> dict[str, Any]:
    """The connector knobs of ``kv_connector_extra_config`` that only the timed engine
    models (``offload_prompt_only``, ``sync_load_budget_bytes``), checked (its
    ``secondary_tiers`` are read by :func:`options_from_vllm_config`, as in cache mode)."""
    return _connector_knobs(extra)


def _connector_knobs(extra: dict[str, Any]) -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    if "offload_prompt_only" in extra:
        value = extra["offload_prompt_only"]
        if not isinstance(value, bool):
            raise InputError(
                f"--vllm-config: offload_prompt_only must be true or false, got {value!r}"
            )
        knobs["offload_prompt_only"] = value
    if "sync_load_budget_bytes" in extra:
        budget = _vllm_number(extra, "sync_load_budget_bytes", int)
        if budget < 0:
            raise InputError(f"--vllm-config: sync_load_budget_bytes must be >= 0, got {budget}")
        knobs["sync_load_budget_bytes"] = budget
    return knobs


def refuse_engine_knobs_in_cache_mode(extra: dict[str, Any]) -> None:
    """Cache mode has no steps and no decode: a connector knob that would change what vLLM
    does there is an error, not a silent no-op (their defaults are accepted)."""
    knobs = _connector_knobs(extra)
    if knobs.get("sync_load_budget_bytes", 0) > 0:
        raise InputError(
            "--vllm-config: sync_load_budget_bytes is about timing, which cache mode does not "
            "model; use kvsim simulate"
        )
    if knobs.get("offload_prompt_only") is False:
        raise InputError(
            "--vllm-config: offload_prompt_only=false stores decode chunks, which cache mode "
            "(prompts only) does not model; use kvsim simulate"
        )


def _vllm_number(extra: dict[str, Any], key: str, kind: type[_Number]) -> _Number:
    """``extra[key]`` as ``kind``: a JSON number (an integral one for ``int``), not a bool."""
    value = extra[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and value != int(value))
    ):
        raise InputError(
            f"--vllm-config: {key} must be "
            f"{'an integer' if kind is int else 'a number'}, got {value!r}"
        )
    return kind(value)


def _vllm_chunk_tokens(extra: dict[str, Any], gpu_block_tokens: int) -> int:
    """Tokens per CPU chunk: vLLM's ``block_size``, or ``blocks_per_chunk`` GPU blocks, or
    one GPU block (vLLM's default)."""
    if "block_size" in extra and "blocks_per_chunk" in extra:
        raise InputError("--vllm-config: block_size and blocks_per_chunk cannot be combined")
    if "block_size" in extra:
        size = _vllm_number(extra, "block_size", int)
        if size <= 0:
            raise InputError(f"--vllm-config: block_size must be > 0, got {size}")
        return size
    if "blocks_per_chunk" in extra:
        bpc = _vllm_number(extra, "blocks_per_chunk", int)
        if bpc <= 0:
            raise InputError(f"--vllm-config: blocks_per_chunk must be > 0, got {bpc}")
        return bpc * gpu_block_tokens
    return gpu_block_tokens
