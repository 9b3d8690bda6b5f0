"""Trace data model: one :class:`Request` per trace record, and a re-iterable :class:`Trace`.

A file-backed :class:`Trace` streams :class:`Request` objects on every ``iter(trace)``; its
file is parsed once (or loaded from the trace cache) and kept as compact columns, never as
a list of requests (see :mod:`kvsim.traces.source`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kvsim.core.errors import InputError


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request of a trace.

    ``block_hashes`` holds one id per block of ``block_tokens`` prompt tokens, prefix-chained:
    two requests have the same id at index ``i`` exactly when their prompts are equal up to the
    end of block ``i``. It may include the id of the trailing partial block (Mooncake and
    Bailian traces do). It is empty when the trace carries no reuse information (Azure).
    """

    request_id: int  # 0-based index in trace order
    arrival_s: float  # seconds since trace start
    prompt_tokens: int  # the prompt's length (Mooncake's input_length, Azure's ContextTokens)
    output_tokens: int
    block_hashes: tuple[int, ...]
    session_id: int | None = None  # e.g. Bailian chat_id; None when unknown

    @property
    def input_tokens(self) -> int:
        """``prompt_tokens`` by its earlier name, for code written before the rename."""
        return self.prompt_tokens

    def complete_blocks(self, block_tokens: int) -> int:
        """Number of complete (cacheable) blocks.

        ``min(prompt_tokens // block_tokens, len(block_hashes))``."""
        n = self.prompt_tokens // block_tokens
        m = len(self.block_hashes)
        return n if n < m else m


def late_arrivals(arrivals: Iterable[float]) -> tuple[int, int]:
    """``(late, total)``: how many arrival times come earlier than one before them, and how
    many there are. A replay takes a trace in its file order, the timed engine in time
    order: a late request is where the two differ.

    Args:
        arrivals: the requests' arrival times, in file order.
    Returns:
        ``(late, total)``; ``late == 0`` exactly when the times never decrease."""
    late = total = 0
    latest = -math.inf
    for t in arrivals:
        total += 1
        if t < latest:
            late += 1
        else:
            latest = t
    return late, total


def repeated_block_id(ids: tuple[int, ...] | list[int]) -> str | None:
    """Describe the first id that repeats within one request, or None.

    Prefix-chained ids never repeat inside a prompt (equal ids mean equal prefixes, hence
    equal lengths); a repeat would make two blocks of one request share a cache entry.
    """
    if len(set(ids)) == len(ids):
        return None
    first: dict[int, int] = {}
    for i, h in enumerate(ids):
        if h in first:
            return (
                f"id {h} repeats (elements {first[h]} and {i}); block ids are prefix-chained "
                "and never repeat within a request"
            )
        first[h] = i
    return None


@dataclass(frozen=True)
class TraceInfo:
    """Where a trace comes from and how to read its block ids."""

    path: str
    format: str  # "mooncake" | "bailian" | "azure" | "native"
    block_tokens: int  # tokens per hash block
    has_reuse_info: bool  # False for Azure: its requests have no block_hashes


class Trace:
    """A re-iterable, streaming sequence of :class:`Request`.

    Build one with :func:`kvsim.traces.open_trace` (file-backed) or :meth:`Trace.from_requests`
    (in memory). ``iter(trace)`` starts from the first request every time; at most ``limit``
    requests are produced when ``limit`` is not None.
    """

    __slots__ = ("_reader", "_requests", "info", "limit")

    def __init__(
        self,
        info: TraceInfo,
        limit: int | None = None,
        reader: Callable[[TraceInfo, int | None], Iterator[Request]] | None = None,
    ):
        """``reader(info, limit)`` streams a file's requests (the readers module passes its
        own, so this model needs no reader code)."""
        self.info = info
        self.limit = limit
        self._requests: list[Request] | None = None
        self._reader = reader

    @classmethod
    def from_requests(
        cls, requests: list[Request], block_tokens: int, name: str = "<memory>"
    ) -> Trace:
        """An in-memory trace over ``requests`` (kept as given, including their request_id)."""
        reqs = list(requests)
        for r in reqs:
            problem = repeated_block_id(r.block_hashes)
            if problem is not None:
                raise InputError(f"request {r.request_id}: block_hashes: {problem}", source=name)
        info = TraceInfo(
            path=name,
            format="native",
            block_tokens=block_tokens,
            has_reuse_info=any(r.block_hashes for r in reqs) or not reqs,
        )
        t = cls(info, None)
        t._requests = reqs
        return t

    def with_limit(self, limit: int | None) -> Trace:
        """The same trace, capped at ``limit`` requests (in memory or streamed alike)."""
        t = Trace(self.info, limit, self._reader)
        t._requests = self._requests
        return t

    @property
    def block_tokens(self) -> int:
        return self.info.block_tokens

    @property
    def path(self) -> str:
        return self.info.path

    @property
    def format(self) -> str:
        return self.info.format

    def __iter__(self) -> Iterator[Request]:
        if self._requests is not None:
            reqs = self._requests if self.limit is None else self._requests[: self.limit]
            return iter(reqs)
        if self._reader is None:
            raise ValueError("a file-backed Trace needs a reader; build it with open_trace")
        return self._reader(self.info, self.limit)

    def __repr__(self) -> str:
        lim = "" if self.limit is None else f", limit={self.limit}"
        return (
            f"Trace({self.info.path!r}, format={self.info.format!r}, "
            f"block_tokens={self.info.block_tokens}{lim})"
        )
