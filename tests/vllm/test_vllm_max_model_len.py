"""kvsim's ``max_model_len`` rule (:func:`kvsim.specs.context.served_output`, which the
engine's admission applies) against vLLM 0.33's own server checks, driven on CPU: the
prompt check (``TokenizeParams``: ``max_tokens`` past ``max_model_len``, then the prompt
length), the cut (``get_max_tokens``) and ``SamplingParams``' least ``max_tokens`` of 1.
The empty prompt is the input processor's check, which needs a whole engine: not driven.
Skipped without vLLM (failed under ``KVSIM_REQUIRE_VLLM=1``)."""

from __future__ import annotations

import pytest
from support import need_vllm

need_vllm("vllm.entrypoints.serve.utils.api_utils")

from vllm import SamplingParams  # noqa: E402
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.renderers.params import TokenizeParams  # noqa: E402

from kvsim.specs.context import served_output  # noqa: E402

pytestmark = pytest.mark.vllm

MML = 100


def vllm_serves(prompt: int, max_tokens: int) -> int | None:
    """The ``max_tokens`` vLLM 0.33's completions server runs a request with, or None where
    it answers 400: the order of ``OpenAIServingCompletion``'s checks."""
    try:
        params = TokenizeParams(max_total_tokens=MML, max_output_tokens=max_tokens)
        params._token_len_check(None, [1] * prompt)
        n = get_max_tokens(MML, max_tokens, prompt, {})
        SamplingParams(max_tokens=n)
    except (ValueError, VLLMValidationError):  # the server's 400s
        return None
    return n


@pytest.mark.parametrize("prompt", [1, 40, 60, 99, 100, 101, 250])
@pytest.mark.parametrize("max_tokens", [1, 39, 40, 41, 99, 100, 101, 500])
def test_kvsims_rule_is_vllms_server(prompt, max_tokens):
    assert served_output(prompt, max_tokens, MML, False) == vllm_serves(prompt, max_tokens)
