"""Trace tests start from an empty in-memory trace cache with zeroed counters (the cache
folder is each test's own: ``tests/conftest.py``), and can count real parses."""

from __future__ import annotations

import pytest

from kvsim.traces import cache, readers


@pytest.fixture(autouse=True)
def _fresh_trace_cache() -> None:
    cache.forget()
    cache.STATS.clear()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files actually parsed (not loaded from the cache), in order."""
    seen: list[str] = []
    real = readers.read_batches

    def counted(path: str, fmt: str, block_tokens: int):  # type: ignore[no-untyped-def]
        seen.append(path)
        return real(path, fmt, block_tokens)

    monkeypatch.setattr(readers, "read_batches", counted)
    return seen
