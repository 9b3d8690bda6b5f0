"""kvsim's rule for the requests a step may hold (:func:`kvsim.specs.context.batch_max_num_seqs`,
which ``kvsim simulate`` and ``kvsim accuracy`` apply) against vLLM 0.33's own code, driven
on CPU: ``SchedulerConfig`` refuses a ``max_num_seqs`` above ``max_num_batched_tokens``, and
``EngineArgs`` cuts its default ``max_num_seqs`` to the step's budget where none is given.
Skipped without vLLM (failed under ``KVSIM_REQUIRE_VLLM=1``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support import need_vllm

need_vllm("vllm.engine.arg_utils")

from vllm.config import SchedulerConfig  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402

from kvsim.core.errors import InputError  # noqa: E402
from kvsim.specs.context import batch_max_num_seqs  # noqa: E402

pytestmark = pytest.mark.vllm

NAMES = ("--max-num-batched-tokens", "--max-num-seqs")
SERVE = UsageContext.OPENAI_API_SERVER


def vllm_starts(budget: int, seqs: int) -> bool:
    """Whether vLLM 0.33's scheduler config takes ``seqs`` requests a step in ``budget``
    tokens (chunked prefill on, so the length check does not speak)."""
    try:
        SchedulerConfig(
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            max_model_len=4096,
            is_encoder_decoder=False,
            enable_chunked_prefill=True,
        )
    except ValueError:
        return False
    return True


def vllm_default_seqs(budget: int, default_seqs: int) -> int:
    """The ``max_num_seqs`` ``vllm serve`` starts with given ``budget`` and no count, where
    the GPU's default is ``default_seqs``: ``EngineArgs``' own defaulting, its GPU lookup
    replaced by the default it would find."""
    args = EngineArgs(max_num_batched_tokens=budget)
    args.get_batch_defaults = lambda world_size: ({SERVE: 8192}, {SERVE: default_seqs})
    model = SimpleNamespace(max_model_len=4096, is_multimodal_model=False, is_mm_prefix_lm=False)
    parallel = SimpleNamespace(use_batched_dp_moe=False)
    args._set_default_max_num_seqs_and_batched_tokens_args(SERVE, model, parallel)
    assert args.max_num_seqs is not None
    return args.max_num_seqs


@pytest.mark.parametrize("budget", [1, 64, 127, 128, 129, 2048])
@pytest.mark.parametrize("seqs", [1, 128, 1024])
def test_a_count_above_the_budget_is_refused_as_vllm_refuses_it(budget, seqs):
    try:
        ours = batch_max_num_seqs(budget, seqs, 1024, NAMES) == seqs
    except InputError as e:
        assert str(e).startswith(f"--max-num-batched-tokens {budget} is below --max-num-seqs")
        ours = False
    assert ours == vllm_starts(budget, seqs)


@pytest.mark.parametrize("budget", [1, 64, 256, 1023, 1024, 8192])
@pytest.mark.parametrize("default_seqs", [256, 1024])
def test_no_count_given_is_the_gpus_default_cut_to_the_budget(budget, default_seqs):
    got = batch_max_num_seqs(budget, None, default_seqs, NAMES)
    assert got == vllm_default_seqs(budget, default_seqs)
    assert vllm_starts(budget, got)
