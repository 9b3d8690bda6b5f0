"""Which requests of a trace a validation runs: all of them, or the turns of conversations.

A validation compares load jobs only where later requests load what earlier ones stored, and
in Mooncake's conversation trace that is rare within a short stretch: almost every request
shares its first block (a common system prompt, which stays in the GPU cache) and little
else, and a turn's follow-up arrives a median of about 200 requests later, by when a CPU
tier of tens of GiB has long evicted it. The first 200 requests gave two load jobs.

``conversation_turns`` keeps the requests that share at least their first two blocks with
another request among the first ``window`` of the trace (block ids are prefix-chained, so
the second block's id names the two-block prefix): the turns of multi-turn conversations,
in trace order, arrivals shifted so the first kept one arrives at 0. Their follow-ups then
come a few dozen requests later, so loads happen at a pinnable tier size. The selection
depends on the trace alone; :func:`write_mooncake` writes it as a trace file, so a run on
it can be repeated with ``kvsim validate FILE``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Sequence

from kvsim.core.io import atomic_text
from kvsim.traces.model import Request

SELECTIONS = ("all", "conversations")
WINDOW_PER_REQUEST = 10  # conversations: look for partners among 10 x the requests kept


def conversation_turns(requests: Sequence[Request], count: int | None = None) -> list[Request]:
    """The first ``count`` (all without one) requests sharing their first two blocks with
    another of ``requests``, arrivals rebased to the first kept one; ``requests`` is the
    window to look in (the caller reads ``WINDOW_PER_REQUEST x count`` of the trace)."""
    seen = Counter(r.block_hashes[1] for r in requests if len(r.block_hashes) > 1)
    kept = [r for r in requests if len(r.block_hashes) > 1 and seen[r.block_hashes[1]] > 1]
    kept = kept[:count] if count is not None else kept
    if not kept:
        return []
    t0 = kept[0].arrival_s
    return [dataclasses.replace(r, arrival_s=r.arrival_s - t0) for r in kept]


def write_mooncake(requests: Sequence[Request], path: str | os.PathLike[str]) -> None:
    """``requests`` as Mooncake JSONL (timestamps in whole milliseconds), written whole."""
    with atomic_text(path) as f:
        for r in requests:
            row = {
                "timestamp": round(r.arrival_s * 1000),
                "input_length": r.prompt_tokens,
                "output_length": r.output_tokens,
                "hash_ids": list(r.block_hashes),
            }
            f.write(json.dumps(row) + "\n")
