"""Under ``KVSIM_REQUIRE_VLLM=1`` (CI) a skipped vLLM differential test fails the run: the
strongest evidence kvsim has must run where it lands, not be skipped there."""

from __future__ import annotations

import pytest
from support import REQUIRE_VLLM

_skipped_vllm: list[str] = []
_ran_vllm: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "vllm" not in report.keywords:
        return
    if report.skipped:
        _skipped_vllm.append(report.nodeid)
    elif report.when == "call":
        _ran_vllm.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not REQUIRE_VLLM or session.config.option.collectonly:
        return
    selected_vllm = any("vllm" in item.keywords for item in session.items)
    if _skipped_vllm or (selected_vllm and not _ran_vllm):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"KVSIM_REQUIRE_VLLM=1: {len(_skipped_vllm)} vLLM differential test(s) "
                f"skipped, {len(_ran_vllm)} ran; a skipped differential test fails CI",
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
