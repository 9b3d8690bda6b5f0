"""kvsim policies as vLLM 0.33 ``CachePolicy`` subclasses, for vLLM to load unchanged.

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": ...,
            "eviction_policy": "KvsimS3FIFO",
            "cache_policy_module_path": "kvsim.integrations.vllm"}}'

vLLM resolves ``getattr(kvsim.integrations.vllm, "KvsimS3FIFO")``; the class is built on
first access (module ``__getattr__``), which is the only place vLLM gets imported.
Every exported class wraps one kvsim policy instance and forwards vLLM's calls to it:

* vLLM's ``ChunkStatus`` objects are passed through unchanged (kvsim policies only read
  ``ref_cnt``, which ``ChunkStatus`` has);
* each vLLM ``ReqContext`` gets one kvsim :class:`~kvsim.core.context.RequestContext`, kept in
  the ReqContext's own state, whose positions are the ReqContext's offload-key positions.

Belady is not exported: it needs the future of the trace, which a live server lacks.
A user's own kvsim policy is exported with :func:`vllm_policy_class`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvsim.core.context import RequestContext
from kvsim.policies.registry import VLLM_EXPORTS

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadKey, ReqContext

    from kvsim.policies.base import EvictionPolicy

#: exported class name -> kvsim registry name
EXPORTS: dict[str, str] = VLLM_EXPORTS

_built: dict[str, type] = {}


class _KvsimContext:
    """Holder stored in a vLLM ReqContext's state (vLLM keys that state by type)."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx


class _PositionView:
    """Read-only positions through ``get_offload_key_position`` (no private attributes)."""

    __slots__ = ("_vctx",)

    def __init__(self, vctx: ReqContext) -> None:
        self._vctx = vctx

    def get(self, key: OffloadKey, default: int | None = None) -> int | None:
        pos = self._vctx.get_offload_key_position(key)
        return default if pos is None else pos

    def __contains__(self, key: OffloadKey) -> bool:
        return self._vctx.get_offload_key_position(key) is not None

    def __getitem__(self, key: OffloadKey) -> int:
        pos = self._vctx.get_offload_key_position(key)
        if pos is None:
            raise KeyError(key)
        return pos

    def keys(self) -> _KnownKeys:
        return _KnownKeys(self)


class _KnownKeys:
    """``positions.keys() >= some_keys`` without enumerating (vLLM exposes lookups only)."""

    __slots__ = ("_view",)

    def __init__(self, view: _PositionView) -> None:
        self._view = view

    def __contains__(self, key: OffloadKey) -> bool:
        return key in self._view

    def __ge__(self, keys: Iterable[OffloadKey]) -> bool:
        return all(k in self._view for k in keys)


def kvsim_context(vctx: ReqContext | None) -> RequestContext:
    """The kvsim context of a vLLM ReqContext (created once, then reused)."""
    if vctx is None:
        return RequestContext(None)
    holder = vctx.get_state(_KvsimContext)
    if holder is None:
        positions = getattr(vctx, "_offload_key_positions", None)
        if not isinstance(positions, dict):
            positions = _PositionView(vctx)
        # vLLM's own positions dict, or a lookup-only view standing in for it
        holder = _KvsimContext(RequestContext(vctx.req_id, positions))  # type: ignore[arg-type]
        vctx.set_state(holder)
    return holder.ctx


def vllm_policy_class(
    policy: str | type[EvictionPolicy], class_name: str | None = None
) -> type[Any]:
    """A vLLM ``CachePolicy`` subclass wrapping a kvsim policy (name, module:Class or class)."""
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

    from kvsim.policies.registry import eviction_policy_class

    cls = eviction_policy_class(policy) if isinstance(policy, str) else policy
    if getattr(cls, "needs_future", False):
        raise ValueError(f"{cls.__name__} needs the future of the trace; it cannot run inside vLLM")

    def __init__(self: Any, cache_capacity: int) -> None:
        CachePolicy.__init__(self, cache_capacity)
        self.policy = cls(cache_capacity)

    def on_request_finished(
        self: Any,
        key_groups: Iterable[Iterable[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        self.policy.on_request_finished(
            [list(g) for g in key_groups],
            insertion_only_keys,
            reused_keys,
            kvsim_context(req_context),
        )

    methods = {
        "__init__": __init__,
        "__doc__": f"vLLM CachePolicy running kvsim's {cls.__name__}.",
        "__module__": __name__,
        "kvsim_policy_class": cls,
        "get": lambda self, key: self.policy.get(key),
        "insert": lambda self, key, chunk, req_context: self.policy.insert(
            key, chunk, kvsim_context(req_context)
        ),
        "remove": lambda self, key: self.policy.remove(key),
        "touch": lambda self, keys, req_context: self.policy.touch(
            list(keys), kvsim_context(req_context)
        ),
        "on_store_miss": lambda self, keys, req_context: self.policy.on_store_miss(
            list(keys), kvsim_context(req_context)
        ),
        "on_request_access": lambda self, keys, req_context: self.policy.on_request_access(
            list(keys), kvsim_context(req_context)
        ),
        "on_request_finished": on_request_finished,
        "evict": lambda self, n, protected: self.policy.evict(n, protected),
        "clear": lambda self: self.policy.clear(),
        "mark_evictable": lambda self, key: self.policy.mark_evictable(key),
        "mark_non_evictable": lambda self, key: self.policy.mark_non_evictable(key),
    }
    name = class_name or f"Kvsim{cls.__name__}"
    adapter = type(name, (CachePolicy,), methods)
    adapter.__qualname__ = name
    return adapter


def __getattr__(name: str) -> type:
    if name in EXPORTS:
        if name not in _built:
            _built[name] = vllm_policy_class(EXPORTS[name], name)
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])
