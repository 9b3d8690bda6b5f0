"""Policies by name: the built-ins, then ``module:Class`` (or vLLM's name + module path).

A user's own class must subclass :class:`EvictionPolicy` (or :class:`AdmissionPolicy`);
anything else is rejected with an error that says what is missing.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, TypeVar

from kvsim.core.errors import InputError, PolicyFault
from kvsim.options.config import THRESHOLD_FILTERS_FROM, CacheConfig, resolve_admission
from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.admission.length import LengthAdmission
from kvsim.policies.admission.probabilistic import ProbabilisticAdmission
from kvsim.policies.admission.threshold import StoreThresholdAdmission
from kvsim.policies.admission.tinylfu import TinyLFUAdmission
from kvsim.policies.arc import ARCPolicy
from kvsim.policies.arc_textbook import TextbookARCPolicy
from kvsim.policies.base import EvictionPolicy
from kvsim.policies.belady import BeladyPolicy
from kvsim.policies.fifo import FIFOPolicy
from kvsim.policies.lfu import LFUPolicy
from kvsim.policies.lru import LRUPolicy
from kvsim.policies.s3fifo import S3FIFOPolicy
from kvsim.policies.sieve import SievePolicy
from kvsim.policies.slru import SLRUPolicy
from kvsim.policies.wtinylfu import WTinyLFUPolicy

EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {}
ADMISSION_POLICIES: dict[str, type[AdmissionPolicy]] = {}

_Policy = TypeVar("_Policy", EvictionPolicy, AdmissionPolicy)


def _register(
    table: dict[str, type[_Policy]], kind: str, cls: type[_Policy], name: str | None
) -> type[_Policy]:
    key = (name or cls.name).lower()
    if key in table and table[key] is not cls:
        raise ValueError(f"{kind} policy {key!r} is already registered")
    table[key] = cls
    return cls


def register_eviction(cls: type[EvictionPolicy], name: str | None = None) -> type[EvictionPolicy]:
    """Register an eviction policy class under ``name`` (default ``cls.name``)."""
    return _register(EVICTION_POLICIES, "eviction", cls, name)


def register_admission(
    cls: type[AdmissionPolicy], name: str | None = None
) -> type[AdmissionPolicy]:
    """Register an admission policy class under ``name`` (default ``cls.name``)."""
    return _register(ADMISSION_POLICIES, "admission", cls, name)


for _eviction in (
    LRUPolicy,
    ARCPolicy,
    FIFOPolicy,
    LFUPolicy,
    TextbookARCPolicy,
    SievePolicy,
    S3FIFOPolicy,
    SLRUPolicy,
    WTinyLFUPolicy,
    BeladyPolicy,
):
    register_eviction(_eviction)
for _admission in (
    AdmissionPolicy,
    StoreThresholdAdmission,
    ProbabilisticAdmission,
    TinyLFUAdmission,
    LengthAdmission,
):
    register_admission(_admission)


def _import_class(spec: str, option: str) -> object:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"{option}: expected NAME or module:Class, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"{option}: cannot import module {module_name!r} ({exc})") from None
    except (Exception, SystemExit) as exc:  # the user's module raised (or exited) importing
        raise InputError(
            f"{option}: importing module {module_name!r} failed ({type(exc).__name__}: {exc})"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise InputError(f"{option}: module {module_name!r} has no attribute {attr!r}") from None


def _check_subclass(obj: object, base: type[Any], option: str, spec: str) -> type[Any]:
    """``obj`` itself, once it is a concrete subclass of ``base`` (a user's class, checked
    at run time)."""
    if not inspect.isclass(obj):
        raise InputError(f"{option}: {spec!r} is not a class")
    if not issubclass(obj, base):
        required = sorted(getattr(base, "__abstractmethods__", ())) or ["record_offer", "admit"]
        raise InputError(
            f"{option}: {spec!r} must subclass {base.__module__}.{base.__qualname__} "
            f"(implementing {', '.join(required)})"
        )
    missing = sorted(getattr(obj, "__abstractmethods__", ()))
    if missing:
        raise InputError(f"{option}: {spec!r} does not implement {', '.join(missing)}")
    return obj


#: the vLLM CachePolicy classes kvsim.integrations.vllm exports -> the kvsim policy each runs
VLLM_EXPORTS: dict[str, str] = {
    "KvsimLRU": "lru",
    "KvsimARC": "arc",
    "KvsimFIFO": "fifo",
    "KvsimLFU": "lfu",
    "KvsimARCTextbook": "arc-textbook",
    "KvsimSieve": "sieve",
    "KvsimS3FIFO": "s3fifo",
    "KvsimSLRU": "slru",
    "KvsimWTinyLFU": "wtinylfu",
}
VLLM_EXPORT_MODULE = "kvsim.integrations.vllm"


def eviction_policy_class(
    spec: str, module_path: str | None = None, option: str = "--policy"
) -> type[EvictionPolicy]:
    """Resolve ``lru``, ``arc``, ..., ``pkg.mod:Class``, or vLLM's (name, module path); an
    error names ``option``, where the name came from (``--policies``, a file's key)."""
    return _resolve(EVICTION_POLICIES, EvictionPolicy, option, "eviction policy", spec, module_path)


def config_policy_class(config: CacheConfig) -> type[EvictionPolicy]:
    """The eviction policy class a run's configuration names, resolved once per
    configuration (kept on it): the manager, the cache-mode driver and the tiers read this,
    not the name. (Options sit a layer below the policies, so the class is resolved at its
    first use rather than when the options are; a configuration copied with another policy
    resolves its own.)"""
    key = (config.policy, config.policy_module)
    memo = config.__dict__.get("_policy_class")
    if memo is None or memo[0] != key:
        memo = (key, eviction_policy_class(*key))
        object.__setattr__(config, "_policy_class", memo)
    cls: type[EvictionPolicy] = memo[1]
    return cls


def make_eviction_policy(
    spec: str | type[EvictionPolicy], capacity: int, module_path: str | None = None
) -> EvictionPolicy:
    """A policy of ``capacity`` chunks: ``spec`` a name (resolved here) or a class already
    resolved (:func:`config_policy_class`); a user's policy that fails to build is a
    :class:`PolicyFault`."""
    cls = spec if isinstance(spec, type) else eviction_policy_class(spec, module_path)
    try:
        return cls(capacity)
    except InputError:
        raise
    except (Exception, SystemExit) as exc:
        if cls.__module__.startswith("kvsim."):
            raise
        raise PolicyFault(cls, f"__init__({capacity})", f"{type(exc).__name__}: {exc}") from None


def admission_policy_class(spec: str) -> type[AdmissionPolicy]:
    return _resolve(ADMISSION_POLICIES, AdmissionPolicy, "--admission", "admission policy", spec)


def _resolve(
    table: dict[str, type[_Policy]],
    base: type[Any],
    option: str,
    noun: str,
    spec: str,
    module_path: str | None = None,
) -> type[_Policy]:
    """A registered name (any case), ``pkg.mod:Class``, or ``spec`` looked up in ``module_path``;
    anything else is a one-line error listing the known names."""
    cls = table.get(spec.lower())
    if cls is not None:
        return cls
    if module_path == VLLM_EXPORT_MODULE and spec in VLLM_EXPORTS and table is EVICTION_POLICIES:
        # the config deployed into vLLM, fed back: the kvsim policy itself (no vLLM needed)
        return table[VLLM_EXPORTS[spec]]
    if ":" in spec:
        return _check_subclass(_import_class(spec, option), base, option, spec)
    if module_path:
        return _check_subclass(_import_class(f"{module_path}:{spec}", option), base, option, spec)
    known = ", ".join(sorted(table))
    raise InputError(f"{option}: unknown {noun} {spec!r}; known: {known} (or module:Class)")


def make_admission(
    spec: str = "always", *, store_threshold: int = 0, max_tracker_size: int = 64_000, **kwargs: Any
) -> AdmissionPolicy:
    """Build an admission policy (``always`` with ``store_threshold >= 2`` is the threshold,
    as :func:`kvsim.options.offload.resolve_admission` decides for every run)."""
    spec = resolve_admission(spec, store_threshold)
    name, _, arg = spec.partition(":")
    if store_threshold >= THRESHOLD_FILTERS_FROM and (arg or name.lower() != "threshold"):
        raise InputError(
            f"--store-threshold {store_threshold} is vLLM's threshold rule, which "
            f"--admission {spec} replaces: give one of them"
        )
    builtin = ADMISSION_POLICIES.get(name.lower()) if arg else None
    if builtin is not None:  # NAME:ARG, e.g. probabilistic:0.5, length:2048, tinylfu:3
        from_arg = getattr(builtin, "from_arg", None)
        if from_arg is None:
            raise InputError(f"--admission: {name!r} takes no argument (got {spec!r})")
        if builtin is StoreThresholdAdmission:
            kwargs = {"max_tracker_size": max_tracker_size}
        policy: AdmissionPolicy = from_arg(arg, **kwargs)
        return policy
    cls = admission_policy_class(spec)
    if cls is StoreThresholdAdmission:
        return cls(max(store_threshold, THRESHOLD_FILTERS_FROM), max_tracker_size)
    try:
        params = inspect.signature(cls).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}  # e.g. seed, when accepted
        return cls(**kwargs)
    except TypeError as exc:
        raise InputError(f"--admission: cannot construct {spec!r}: {exc}") from None


def describe_policies() -> list[tuple[str, str, str]]:
    """(kind, name, one-line description) for every registered policy."""
    rows = [("eviction", n, c.description) for n, c in sorted(EVICTION_POLICIES.items())]
    rows += [("admission", n, c.description) for n, c in sorted(ADMISSION_POLICIES.items())]
    return rows
