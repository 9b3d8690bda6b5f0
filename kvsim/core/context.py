"""Per-request scratch state shared by the manager and the policies.

Mirrors vLLM 0.33's ``ReqContext``: the connector records each offload key's token end
position, and the manager and policies keep per-request state keyed by their owner, so
one policy object can serve many concurrent requests without global counters.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from kvsim.core.keys import ChunkKey


class RequestContext:
    """Identity of one request plus the token end position of each of its chunk keys."""

    __slots__ = ("positions", "req_id", "state")

    def __init__(self, req_id: Hashable, positions: dict[ChunkKey, int] | None = None) -> None:
        self.req_id = req_id
        self.positions: dict[ChunkKey, int] = positions if positions is not None else {}
        # owner object -> that owner's state for this request (owner identity replaces
        # vLLM's "state.owner is self" check); each owner knows its own state's type.
        self.state: dict[object, Any] = {}

    def set_key_position(self, key: ChunkKey, end_token: int) -> None:
        self.positions[key] = end_token

    def __repr__(self) -> str:
        return f"RequestContext({self.req_id!r})"


def chunk_positions(keys: Sequence[ChunkKey], chunk_tokens: int) -> dict[ChunkKey, int]:
    """Each chunk key's token end position (chunk i ends at ``(i + 1) * chunk_tokens``), as
    the connector records them for a prompt's chunks, head first."""
    return dict(zip(keys, range(chunk_tokens, (len(keys) + 1) * chunk_tokens, chunk_tokens)))


def order_request_keys(
    key_groups: Iterable[Iterable[ChunkKey]], ctx: RequestContext
) -> list[ChunkKey]:
    """Flatten groups head-to-tail; sort by token position when every position is known."""
    keys = [k for group in key_groups for k in group]
    positions = ctx.positions
    if all(k in positions for k in keys):
        keys.sort(key=positions.__getitem__)
    return keys
