"""Offload keys from a trace's prefix-chained block hashes.

A trace gives one id per hash block of ``block_tokens`` tokens; equal ids mean equal
prefixes. kvsim works on *units* of ``unit_tokens = min(block_tokens, chunk_tokens)``:

* ``chunk_tokens >= block_tokens``: a unit is a trace block and its key is the trace id;
* ``chunk_tokens < block_tokens`` (vLLM's default 16-token chunks on a 512-token trace):
  a trace block splits into ``block_tokens // chunk_tokens`` units whose keys
  ``id * split + j`` are distinct and still identify the whole prefix, so
  sub-chunks hit, miss and get evicted independently, as vLLM's chunks do.

A CPU chunk groups ``units_per_chunk`` units; as in vLLM its key is the key of its last
unit (the hash of the last block inside the chunk). Only complete units and complete
chunks have keys.

This module is the one place keys are made: :meth:`KeyLayout.unit_keys` (trace ids ->
unit keys), :meth:`KeyLayout.chunk_keys` (unit keys -> chunk keys) and
:func:`request_private_key` (chunks that have no trace id, a timed request's output).
Everything else receives keys and only hashes and compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

from kvsim.core.errors import InputError

#: The offload key of one unit (a GPU block, and the CPU chunk it ends): the trace's
#: prefix-chained block id, or ``id * split + j`` for sub-chunks; a CPU chunk is keyed by
#: its last unit. A distinct type so a plain count or id cannot pass for a key; it is an
#: ``int`` at run time (the policies also run inside vLLM on its ``bytes`` OffloadKeys and
#: only ever hash and compare keys).
ChunkKey = NewType("ChunkKey", int)


@dataclass(frozen=True)
class KeyLayout:
    """How a trace's hash blocks map to unit and chunk keys; validated once, at the edge."""

    block_tokens: int  # tokens per trace hash block
    chunk_tokens: int  # tokens per CPU chunk

    def __post_init__(self) -> None:
        b, c = self.block_tokens, self.chunk_tokens
        if b <= 0:
            raise InputError(f"--block-tokens must be positive, got {b}")
        if c <= 0:
            raise InputError(f"--chunk-tokens must be positive, got {c}")
        if c % b and b % c:
            raise InputError(
                f"--chunk-tokens {c} must be a multiple or a divisor of the trace's "
                f"{b}-token hash blocks"
            )

    @property
    def unit_tokens(self) -> int:
        return min(self.block_tokens, self.chunk_tokens)

    @property
    def split(self) -> int:
        """Units per trace block (1 unless chunks are smaller than trace blocks)."""
        return max(1, self.block_tokens // self.chunk_tokens)

    @property
    def units_per_chunk(self) -> int:
        return max(1, self.chunk_tokens // self.block_tokens)

    def unit_keys(self, block_hashes: Sequence[int], input_tokens: int) -> list[ChunkKey]:
        """Keys of the complete units of a prompt, head first (a new list): where trace ids
        become keys. Called once per request by every replay loop, so it stays cheap."""
        bt = self.block_tokens
        if self.chunk_tokens >= bt:  # a unit is a trace block: its key is the trace id
            ids = block_hashes[: input_tokens // bt]
            keys = ids if ids.__class__ is list else list(ids)
            return keys  # type: ignore[return-value]  # the ids are the keys
        split = bt // self.chunk_tokens
        n = min(input_tokens // self.chunk_tokens, len(block_hashes) * split)
        return [block_hashes[i // split] * split + i % split for i in range(n)]  # type: ignore[misc]

    def chunk_keys(self, unit_keys: list[ChunkKey]) -> list[ChunkKey]:
        """Keys of the complete chunks: the key of each chunk's last unit (``unit_keys``
        itself when a chunk is one unit: callers that change the list copy it)."""
        k = self.units_per_chunk
        if k == 1:
            return unit_keys
        return unit_keys[k - 1 :: k]


#: chunks per request that :func:`request_private_key` can number
PRIVATE_KEYS_PER_REQUEST = 1 << 24


def request_private_key(request_id: int, chunk: int) -> ChunkKey:
    """The key of a request's ``chunk``-th chunk where the trace has no id for it (the
    timed engine's decode output): negative and distinct per (request, chunk), so no other
    request can hit it. Trace ids are prefix hashes, non-negative in every published
    trace; a trace with negative ids could collide with these (nothing checks it)."""
    if not 0 <= chunk < PRIVATE_KEYS_PER_REQUEST:
        raise ValueError(f"chunk {chunk} out of range for a private key")
    return ChunkKey(-(1 + request_id * PRIVATE_KEYS_PER_REQUEST + chunk))
