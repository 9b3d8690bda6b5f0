"""Paths and optional-dependency gates shared by the tests, so they run from any folder."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
SAMPLE = str(TRACES / "samples" / "mooncake_small.jsonl")
SYNTHETIC = str(TRACES / "mooncake_fast25_synthetic_trace.jsonl")
CONVERSATION = str(TRACES / "mooncake_fast25_conversation_trace.jsonl")

#: set by CI: a vLLM differential test that cannot import vLLM fails instead of skipping
REQUIRE_VLLM = os.environ.get("KVSIM_REQUIRE_VLLM") == "1"


def need_vllm(module: str) -> ModuleType:
    """Import one of vLLM's modules for a differential test: skip without vLLM, except where
    ``KVSIM_REQUIRE_VLLM=1`` (CI), where a missing vLLM is a failure, not a skip."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if REQUIRE_VLLM:
            pytest.fail(
                f"KVSIM_REQUIRE_VLLM=1 but {module} cannot be imported: {exc}", pytrace=False
            )
        pytest.skip(f"vLLM is not importable ({exc})", allow_module_level=True)


def run_main(args: list[object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``kvsim ARGS`` through the console script's entry point, in this process:
    ``(exit code, stdout, stderr)``."""
    from kvsim.cli import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err
