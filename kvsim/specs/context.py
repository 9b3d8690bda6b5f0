"""vLLM's ``max_model_len`` rules, in one home: what ``vllm serve`` refuses to start with,
and what its server does with a request longer than it. ``kvsim simulate`` and
``kvsim accuracy`` both read them, each naming its own option in the one-line errors.

vLLM 0.33's server (``vllm/entrypoints/serve/utils/api_utils.py`` ``get_max_tokens``,
``vllm/renderers/params.py`` ``_token_len_check``, ``vllm/v1/engine/input_processor.py``
``_validate_prompt_len``) refuses an empty prompt, one of ``max_model_len`` tokens or
more (one that fills it leaves ``max_tokens`` 0, below ``SamplingParams``' least of 1),
and a ``max_tokens`` above ``max_model_len`` (``TokenizeParams.__post_init__``), and cuts
any other request's ``max_tokens`` to ``max_model_len - prompt``. Earlier
servers (v0.15.1 among them: vLLM issue #33418, PR #33425; still so in 0.20, issue
#42474) refused a request whose prompt plus ``max_tokens`` exceeds ``max_model_len``
instead of cutting it (``refuse_past``).
"""

from __future__ import annotations

from kvsim.core.errors import InputError
from kvsim.specs.hardware import GpuSpec, vllm_batch_defaults, vllm_default_batched_tokens
from kvsim.specs.models import ModelSpec
from kvsim.specs.sizing import cdiv

__all__ = [
    "batch_max_num_seqs",
    "check_long_prefill_threshold",
    "check_unchunked_budget",
    "engine_max_model_len",
    "kv_shortfall",
    "served_output",
    "vllm_max_model_len",
    "vllm_step_limits",
]


def engine_max_model_len(model: ModelSpec, given: int | None) -> int:
    """The engine's ``max_model_len``: ``given``, or (None / 0) the one vLLM takes for the
    model (its config's length, or a long-RoPE model's original one; 0: unknown, no
    limit); unchecked (see :func:`vllm_max_model_len`)."""
    return given or model.default_max_model_len or model.derived_max_model_len


def vllm_max_model_len(model: ModelSpec, given: int | None, name: str) -> int:
    """:func:`engine_max_model_len`, checked: vLLM refuses to start with one past the
    length it derives from the model's config: one line naming ``name``, the option as the
    caller spells it."""
    longest = model.derived_max_model_len
    if not given:
        return engine_max_model_len(model, given)
    if longest and given > longest:
        raise InputError(
            f"{name} {given} exceeds {model.name}'s max_model_len from its config "
            f"({longest}): vLLM refuses to start"
        )
    return given


def check_unchunked_budget(budget: int, max_model_len: int, names: tuple[str, str]) -> None:
    """Without chunked prefill vLLM refuses to start with a step budget below
    ``max_model_len`` (a prompt must fit one step). ``names``: how the caller spells the
    budget and the length."""
    if max_model_len and budget < max_model_len:
        raise InputError(
            f"{names[0]} {budget} is below {names[1]} {max_model_len} without chunked "
            "prefill: vLLM refuses to start"
        )


def check_long_prefill_threshold(
    threshold: int, max_model_len: int, names: tuple[str, str]
) -> None:
    """vLLM 0.33 refuses to start with a ``long_prefill_token_threshold`` above
    ``max_model_len`` (``SchedulerConfig.verify_max_model_len``; 0, off, always starts), so a
    cap no prompt could reach is an error, not a run. ``names``: how the caller spells the
    threshold and the length."""
    if max_model_len and threshold > max_model_len:
        raise InputError(
            f"{names[0]} {threshold} exceeds {names[1]} {max_model_len}: vLLM refuses to start"
        )


def batch_max_num_seqs(budget: int, given: int | None, default: int, names: tuple[str, str]) -> int:
    """The requests a step may hold as vLLM 0.33 starts with them: ``given``, which must
    not exceed the step's token ``budget`` (``SchedulerConfig`` refuses it: every request a
    step schedules takes a token), or, given none, the GPU's ``default`` cut to the budget
    (``EngineArgs`` cuts it so). ``names``: how the caller spells the budget and the count."""
    if given is None:
        return min(default, budget)
    if budget < given:
        raise InputError(
            f"{names[0]} {budget} is below {names[1]} {given}: vLLM refuses to start (every "
            "request a step schedules takes a token of its budget)"
        )
    return given


def vllm_step_limits(
    gpu: GpuSpec,
    max_model_len: int,
    length_given: bool,
    chunked: bool,
    given: tuple[int | None, int | None],
    names: tuple[str, str, str],
) -> tuple[int, int]:
    """A step's ``(max_num_batched_tokens, max_num_seqs)`` as vLLM 0.33 starts with them on
    ``gpu``, so a run and a sweep's up-front check refuse the same engines.

    Args:
        max_model_len: the engine's, resolved (:func:`vllm_max_model_len`).
        length_given: whether the user gave it: without chunked prefill, a budget given
            alone and below the model's length stands for both (its longer requests
            refused), so only a given length can make :func:`check_unchunked_budget` refuse.
        chunked: ``enable_chunked_prefill``.
        given: the budget and the count the user gave (None: vLLM's default).
        names: how the caller spells the budget (given, or its default), the count and
            the length.
    """
    budget, seqs = given
    tokens = budget or vllm_default_batched_tokens(gpu, max_model_len, chunked, seqs)
    if length_given and not chunked:
        check_unchunked_budget(tokens, max_model_len, (names[0], names[2]))
    default_seqs = vllm_batch_defaults(gpu)[1]
    return tokens, batch_max_num_seqs(tokens, seqs, default_seqs, (names[0], names[1]))


def kv_shortfall(
    max_model_len: int, block_tokens: int, usable_blocks: int, window_tokens: int | None = None
) -> str | None:
    """Why vLLM 0.33 refuses to start when its GPU KV cannot hold one request of
    ``max_model_len`` tokens, or None where it can.

    vLLM's capacity check (``kv_cache_planning.get_kv_cache_configs``) needs
    ``cdiv(max_model_len, block_size)`` blocks of the usable ones (the null block taken
    out, from memory or ``num_gpu_blocks_override``); the longest it would accept is
    ``usable_blocks * block_tokens``. A model whose every layer slides needs only its
    window's blocks (``SlidingWindowSpec.max_admission_blocks_per_request``): those of
    ``min(window_tokens, max_model_len)`` tokens, and one more (a window starts mid-block).

    Args:
        max_model_len: the engine's (0: no limit, never short).
        block_tokens: vLLM's block size.
        usable_blocks: GPU KV blocks a request can get.
        window_tokens: every layer sliding, the tokens a request keeps at most: the window
            less one plus those in flight (a step's budget, twice with async scheduling);
            None: full attention.
    """
    if not max_model_len:
        return None
    if window_tokens is not None:
        kept = min(window_tokens, max_model_len)
        needed = cdiv(kept, block_tokens) + 1
        if needed <= usable_blocks:
            return None
        return (
            f"a request keeps up to {kept:,} tokens of KV (every layer slides; max_model_len "
            f"{max_model_len:,}), which need {needed:,} GPU KV blocks of {block_tokens} tokens "
            f"and {usable_blocks:,} fit: vLLM 0.33 refuses to start"
        )
    needed = cdiv(max_model_len, block_tokens)
    if needed <= usable_blocks:
        return None
    return (
        f"max_model_len {max_model_len:,} needs {needed:,} GPU KV blocks of "
        f"{block_tokens} tokens and {usable_blocks:,} fit: vLLM 0.33 refuses to start "
        f"(the longest it takes is {usable_blocks * block_tokens:,})"
    )


def served_output(prompt: int, output: int, max_model_len: int, refuse_past: bool) -> int | None:
    """The output tokens vLLM's server lets a request of ``prompt`` tokens asking for
    ``output`` (at least 1) generate, or None where it refuses the request.

    Args:
        max_model_len: the engine's (0: no limit).
        refuse_past: the server before 0.33's cut: prompt + output past ``max_model_len``
            is refused, not cut.
    """
    if not prompt:
        return None
    if not max_model_len or prompt + output <= max_model_len:
        return output
    if refuse_past or prompt >= max_model_len or output > max_model_len:
        return None
    return max_model_len - prompt
