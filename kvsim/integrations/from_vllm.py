"""vLLM -> kvsim: drive vLLM 0.33's own ``CPUOffloadingManager`` through kvsim's replay protocol.

Used by ``kvsim bench`` (speed ratio) and the differential tests (same decisions).
vLLM is imported lazily, only here; kvsim never depends on it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from kvsim.core.keys import ChunkKey
from kvsim.options.config import THRESHOLD_FILTERS_FROM

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadKey, ReqContext
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec


def vllm_available() -> bool:
    try:
        import vllm.v1.kv_offload.cpu.manager  # noqa: F401
    except Exception:
        return False
    return True


def _pack_key(key: int) -> bytes:
    # vLLM's OffloadKey: block-hash bytes + 4-byte big-endian group index (group 0).
    return (key & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") + b"\x00\x00\x00\x00"


#: :func:`_pack_key` typed as vLLM sees its result (``OffloadKey`` is a ``NewType`` of
#: bytes): cast once here rather than per key, and without importing vLLM
_key_bytes = cast("Callable[[int], OffloadKey]", _pack_key)


@dataclass(slots=True)
class _StoreOut:
    """vLLM's ``PrepareStoreOutput`` with kvsim's int keys."""

    keys_to_store: list[ChunkKey]
    evicted_keys: list[ChunkKey]


class VllmManagerDriver:
    """kvsim's manager interface on top of vLLM's manager (int keys in, int keys out).

    It satisfies :class:`kvsim.manager.offload.ManagerProtocol` with vLLM's ``ReqContext`` as the
    request context."""

    def __init__(
        self,
        num_chunks: int,
        policy: str = "lru",
        store_threshold: int = 0,
        max_tracker_size: int = 64_000,
    ) -> None:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        self._ReqContext = ReqContext
        self._hit = LookupResult.HIT
        self._pending = LookupResult.HIT_PENDING
        self.inner = CPUOffloadingManager(
            num_chunks=num_chunks,
            cache_policy=policy,
            store_threshold=store_threshold if store_threshold >= THRESHOLD_FILTERS_FROM else 1,
            max_tracker_size=max_tracker_size,
        )
        self._to_int: dict[bytes, ChunkKey] = {}
        self.counters = None

    @property
    def num_resident(self) -> int:
        m = self.inner
        return m._num_allocated_chunks - len(m._free_list)

    def _k(self, key: ChunkKey) -> OffloadKey:
        b = _key_bytes(key)
        self._to_int[b] = key
        return b

    def new_context(self, req_id: Hashable, positions: dict[ChunkKey, int]) -> ReqContext:
        ctx = self._ReqContext(req_id=str(req_id))
        for key, pos in positions.items():
            ctx.set_offload_key_position(self._k(key), pos)
        return ctx

    def on_new_request(self, ctx: ReqContext) -> None:
        self.inner.on_new_request(ctx)

    def lookup_prefix(self, keys: Iterable[ChunkKey]) -> tuple[int, bool]:
        count, pending = 0, False
        lookup = self.inner.lookup
        for key in keys:
            # vLLM's CPU manager never reads the context of a lookup; the connector's scan has none
            result = lookup(_key_bytes(key), None)  # type: ignore[arg-type]
            if result == self._hit:
                count += 1
            elif result == self._pending:
                count += 1
                pending = True
            else:
                break
        return count, pending

    def prepare_load(self, keys: Sequence[ChunkKey], ctx: ReqContext) -> list[int]:
        spec = self.inner.prepare_load([_key_bytes(k) for k in keys], ctx)
        # typed as the abstract LoadStoreSpec; the CPU manager's is a CPULoadStoreSpec
        return [int(i) for i in cast("CPULoadStoreSpec", spec).block_ids]

    def complete_load(self, keys: Iterable[ChunkKey], ctx: ReqContext | None = None) -> None:
        # vLLM's CPU manager never reads the context here (kvsim's manager allows None)
        self.inner.complete_load([_key_bytes(k) for k in keys], ctx)  # type: ignore[arg-type]

    def prepare_store(self, keys: Iterable[ChunkKey], ctx: ReqContext) -> _StoreOut | None:
        out = self.inner.prepare_store([self._k(k) for k in keys], ctx)
        if out is None:
            return None
        to_int = self._to_int
        return _StoreOut(
            [to_int[b] for b in out.keys_to_store], [to_int[b] for b in out.evicted_keys]
        )

    def complete_store(
        self, keys: Iterable[ChunkKey], ctx: ReqContext | None = None, success: bool = True
    ) -> None:
        # vLLM's CPU manager never reads the context here (kvsim's manager allows None)
        self.inner.complete_store([_key_bytes(k) for k in keys], ctx, success)  # type: ignore[arg-type]

    def on_request_finished(self, ctx: ReqContext) -> None:
        self.inner.on_request_finished(ctx)
