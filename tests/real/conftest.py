"""The real backend's tests all need torch (``real/__init__`` imports it). Without torch
each test file here is reported as one skip instead of a collection error, except under
``KVSIM_REQUIRE_TRITON=1``, where the Triton tests here must run: then each is an error.
Every test here also gets back the process-wide threading knobs the CLI's CPU device sets."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REQUIRE_TRITON

try:
    import torch
except ImportError as exc:
    torch = None
    MISSING = f"tests/real needs torch (pip install 'kvsim[real]'; kvsim[test] has it): {exc}"
else:
    MISSING = ""


class _NeedsTorch(pytest.File):
    """A test file here, collected without torch: nothing to run, one line saying why."""

    def collect(self) -> Iterator[pytest.Item]:
        if REQUIRE_TRITON:
            pytest.fail(f"KVSIM_REQUIRE_TRITON=1: {MISSING}", pytrace=False)
        pytest.skip(MISSING)


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.File | None:
    """Without torch, a test file is not imported (its ``import torch`` would be an error)."""
    return _NeedsTorch.from_parent(parent, path=module_path) if MISSING else None


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Iterator[None]:
    """``kvsim calibrate`` / ``validate`` on the CPU device set torch's thread count and
    the interpreter's switch interval for the whole process; undo them after each test."""
    assert torch is not None  # tests here run only with torch
    n, interval = torch.get_num_threads(), sys.getswitchinterval()
    yield
    torch.set_num_threads(n)
    sys.setswitchinterval(interval)
