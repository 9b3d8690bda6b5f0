"""Under ``KVSIM_REQUIRE_VLLM=1`` (CI) a skipped vLLM differential test fails the run: the
strongest evidence kvsim has must run where it lands, not be skipped there. The same for
``KVSIM_REQUIRE_TRITON=1`` and the tests marked ``triton`` (vLLM's gather kernel run by
Triton's CPU interpreter: the only place the kernel's code runs without a GPU)."""

from __future__ import annotations

import pytest
from support import REQUIRE_TRITON, REQUIRE_VLLM

# marker -> (the variable that requires its tests, whether it is set, what they are)
_REQUIRED = {
    "vllm": ("KVSIM_REQUIRE_VLLM", REQUIRE_VLLM, "vLLM differential"),
    "triton": ("KVSIM_REQUIRE_TRITON", REQUIRE_TRITON, "Triton interpreter"),
}
_skipped: dict[str, list[str]] = {m: [] for m in _REQUIRED}
_ran: dict[str, list[str]] = {m: [] for m in _REQUIRED}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "triton: runs the Triton gather kernel under Triton's CPU interpreter (skipped "
        "without triton, except under KVSIM_REQUIRE_TRITON=1)",
    )
    # torch's own modules use an API torch deprecates, and warn 14 times while vLLM imports
    # them (at the collection of the vLLM tests): not kvsim's code, nothing to act on here
    config.addinivalue_line(
        "filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for marker in _REQUIRED:
        if marker not in report.keywords:
            continue
        if report.skipped:
            _skipped[marker].append(report.nodeid)
        elif report.when == "call":
            _ran[marker].append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.option.collectonly:
        return
    for marker, (variable, required, what) in _REQUIRED.items():
        if not required:
            continue
        skipped, ran = _skipped[marker], _ran[marker]
        selected = any(marker in item.keywords for item in session.items)
        if skipped or (selected and not ran):
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(
                    f"{variable}=1: {len(skipped)} {what} test(s) skipped, {len(ran)} ran; "
                    f"a skipped {what} test fails CI",
                    red=True,
                )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _trace_cache_in_tmp(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests never touch the user's trace cache: each test reads and writes its own, empty
    one (the variables reach the processes a test starts too)."""
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path_factory.mktemp("trace-cache")))
    monkeypatch.delenv("KVSIM_NO_CACHE", raising=False)
