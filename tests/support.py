"""What the tests share, in one place: paths, optional-dependency gates, the CLI in process,
and the helpers several test folders use (driving a policy as the manager does, comparing
requests field for field, the trace cache's folder, vLLM's key encoding).

Fixtures live in ``conftest.py`` files (``tests/conftest.py``: the per-test trace cache;
``tests/traces/conftest.py``: cache counters; ``tests/real/conftest.py``: torch), and the
manager's golden scenarios, shared with the vLLM differential tests, in
``tests/manager_scenarios.py``.
"""

from __future__ import annotations

import gzip
import importlib
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kvsim.core.context import RequestContext
    from kvsim.policies.base import EvictionPolicy

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
SAMPLE = str(TRACES / "samples" / "mooncake_small.jsonl")
SYNTHETIC = str(TRACES / "mooncake_fast25_synthetic_trace.jsonl")
CONVERSATION = str(TRACES / "mooncake_fast25_conversation_trace.jsonl")

#: set by CI: a vLLM differential test that cannot import vLLM fails instead of skipping
REQUIRE_VLLM = os.environ.get("KVSIM_REQUIRE_VLLM") == "1"
#: set by CI: a ``triton`` test that cannot import Triton (or torch) fails instead of skipping
REQUIRE_TRITON = os.environ.get("KVSIM_REQUIRE_TRITON") == "1"


#: marks a test whose timed runs are overloaded on purpose (small workloads sized to run
#: fast): the OverloadWarning they raise is expected there, so it is not shown
expect_overload = pytest.mark.filterwarnings("ignore::kvsim.report.serve_metrics.LoadWarning")


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


# --- a policy driven directly, as the offload manager drives it -----------------------------


def ready(
    policy: EvictionPolicy,
    keys: Sequence[int],
    ctx: RequestContext | None = None,
    start_id: int = 0,
) -> None:
    """Insert ``keys`` (chunk ids from ``start_id``) and complete their stores: each is
    ready (``ref_cnt`` 0) and marked evictable, as after the manager's ``complete_store``."""
    from kvsim.core.context import RequestContext
    from kvsim.policies.base import Chunk

    ctx = ctx if ctx is not None else RequestContext("ready")
    for i, key in enumerate(keys):
        chunk = Chunk(start_id + i)
        policy.insert(key, chunk, ctx)
        chunk.ref_cnt = 0
        policy.mark_evictable(key)


def victims(policy: EvictionPolicy, n: int, protected: Iterable[int] = ()) -> list[Any] | None:
    """The keys ``policy.evict(n, protected)`` returns, in its order (None when it cannot)."""
    out = policy.evict(n, set(protected))
    return None if out is None else [k for k, _ in out]


# --- traces ---------------------------------------------------------------------------------


def exact_fields(requests: Iterable[Any]) -> list[tuple]:
    """Every field of each request with its type (so 1 and 1.0, or a list and a tuple,
    differ, and floats compare bit for bit)."""
    return [
        tuple(
            (type(v).__name__, v.hex() if isinstance(v, float) else v)
            for v in (
                r.request_id,
                r.arrival_s,
                r.prompt_tokens,
                r.output_tokens,
                r.block_hashes,
                r.session_id,
            )
        )
        for r in requests
    ]


def copy_to(src: Path | str, folder: Path, name: str | None = None) -> str:
    """A copy of ``src`` in ``folder`` (a test may change or cache it freely)."""
    dst = folder / (name or Path(src).name)
    shutil.copyfile(src, dst)
    return str(dst)


def gzip_copy(src: Path | str, dst: Path) -> str:
    """``src`` gzipped to ``dst``."""
    with open(src, "rb") as fi, gzip.open(dst, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    return str(dst)


def trace_cache_folder() -> Path:
    """This test's trace cache folder (``tests/conftest.py`` gives each test its own)."""
    return Path(os.environ["KVSIM_CACHE_DIR"])


def trace_cache_entries() -> list[Path]:
    """The entries in this test's trace cache folder."""
    folder = trace_cache_folder()
    return sorted(folder.glob("*.columns")) if folder.exists() else []


def has_files(folder: Path) -> bool:
    return folder.exists() and any(folder.iterdir())


# --- figures -------------------------------------------------------------------------------


def labelled_lines(ax: Any) -> list[Any]:
    """The lines of a matplotlib axes that a legend shows (no ``_``-prefixed helpers)."""
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


# --- vLLM's keys ----------------------------------------------------------------------------


def vllm_key(key: int) -> bytes:
    """kvsim's int key as vLLM's ``OffloadKey``: 8-byte big-endian hash, 4-byte group 0."""
    return key.to_bytes(8, "big") + b"\0\0\0\0"


def kvsim_key(key: bytes) -> int:
    """The int key of a :func:`vllm_key` (group 0 only)."""
    assert key[8:] == b"\0\0\0\0", key
    return int.from_bytes(key[:8], "big")


#: a Llama-3.1-8B-shaped Hugging Face config.json, for tests that pass --model FILE
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
