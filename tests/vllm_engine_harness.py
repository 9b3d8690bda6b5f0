"""The vLLM engine harness lives in the package (``kvsim bench --timed`` drives it too):
:mod:`kvsim.integrations.vllm_engine`. Re-exported here for the tests that import it."""

from kvsim.integrations.vllm_engine import (
    RequestRecord,
    SimTransferWorker,
    StepRecord,
    TransferRecord,
    VllmRun,
    prompt_tokens,
    run_vllm_engine,
)

__all__ = [
    "RequestRecord",
    "SimTransferWorker",
    "StepRecord",
    "TransferRecord",
    "VllmRun",
    "prompt_tokens",
    "run_vllm_engine",
]
