"""The one way kvsim describes a user-facing structure: a :class:`Schema` (a msgspec
``Struct``), from which come validation, bounds, help texts, "did you mean" for unknown keys
and a JSON Schema for editors.

Why msgspec and not pydantic: both give one declarative description; msgspec imports and
builds its types in ~20 ms where pydantic takes ~150 ms, on commands (``kvsim replay``)
whose whole run is a few tenths of a second. vLLM uses msgspec for its own engine structs.

Every error is one line, ``SOURCE: key.path: problem, got VALUE`` (an :class:`InputError`),
with the closest known key for an unknown one; a value is shown shortened, so a huge or
deeply nested input never floods the message.

Example::

    class Link(Schema):
        name: str
        gbps: Annotated[float, Meta(gt=0, description="bandwidth, GB/s")]

    link = load(Link, read_json(path), source=path)
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import msgspec
from msgspec import inspect as mi

from kvsim.core.errors import InputError, did_you_mean

__all__ = ["Schema", "SchemaField", "fields", "json_schema", "load", "short_repr"]

S = TypeVar("S", bound="Schema")


class Schema(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every user-facing structure: unknown keys are errors, values are immutable,
    fields are given by name. Cross-field rules go in ``__post_init__`` and raise
    ``ValueError`` with a message that reads after the key path."""


_PATH = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<path>\$[^`]*)`)?$", re.S)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = _short.maxdict = _short.maxtuple = _short.maxset = 4
_short.maxlevel = 2


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to about 60 characters and two levels: safe for any input."""
    return _short.repr(value)


def load(schema: type[S], data: Any, *, source: str, prefix: str = "") -> S:
    """``data`` (parsed JSON / YAML / keywords) as ``schema``, or a one-line
    :class:`InputError`.

    Args:
        schema: the structure to build.
        data: plain values (dicts, lists, numbers, text).
        source: what to name in an error: a file path, ``--vllm-config``, ``replay()``.
        prefix: a key path that ``data`` sits under in ``source`` (``options``).

    Returns:
        the validated, frozen instance.
    """
    try:
        return msgspec.convert(data, schema, strict=True)
    except msgspec.ValidationError as exc:
        raise _one_line(exc, schema, data, source, prefix) from None


def _one_line(
    exc: msgspec.ValidationError, schema: type[Schema], data: Any, source: str, prefix: str
) -> InputError:
    m = _PATH.match(str(exc))
    assert m is not None  # the pattern matches any text
    msg = m.group("msg")
    steps: list[str | int] = []
    for key, index in _STEP.findall(m.group("path") or "$"):
        if key:
            steps.append(key)
        elif index == "...":  # a mapping's key: msgspec does not say which one
            steps.append(_failing_key(schema, data, steps))
        else:
            steps.append(int(index))
    value = _at(data, steps)
    unknown = _UNKNOWN.match(msg)
    if unknown:
        key = unknown.group("key")
        steps.append(key)
        value = value.get(key) if isinstance(value, Mapping) else None
        msg = "unknown key" + did_you_mean(key, _known_keys(schema, steps[:-1]))
    path = _dotted([*prefix.split(".")] if prefix else [], steps)
    where = f"{path}: " if path else ""
    return InputError(f"{where}{msg}, got {short_repr(value)}", source=source)


def _dotted(prefix: list[str], steps: list[str | int]) -> str:
    out = ".".join(prefix)
    for s in steps:
        out += f"[{s}]" if isinstance(s, int) else (f".{s}" if out else s)
    return out


def _at(data: Any, steps: list[str | int]) -> Any:
    for s in steps:
        try:
            data = data[s]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _type_at(schema: Any, steps: list[str | int]) -> Any:
    """The msgspec type info reached by ``steps`` from ``schema`` (None where unknown)."""
    t: Any = mi.type_info(schema)
    for s in steps:
        t = _unwrap(t)
        if isinstance(t, mi.StructType) and isinstance(s, str):
            t = next((f.type for f in t.fields if f.encode_name == s), None)
        elif isinstance(t, (mi.ListType, mi.TupleType, mi.VarTupleType)):
            t = getattr(t, "item_type", None)
        elif isinstance(t, mi.DictType):
            t = t.value_type
        else:
            return None
    return _unwrap(t)


def _unwrap(t: Any) -> Any:
    """The struct inside ``X | None`` and similar unions, if there is exactly one."""
    if isinstance(t, mi.UnionType):
        structs = [u for u in t.types if isinstance(u, (mi.StructType, mi.DictType))]
        if len(structs) == 1:
            return structs[0]
    return t


def _known_keys(schema: type[Schema], steps: list[str | int]) -> list[str]:
    t = _type_at(schema, steps)
    return [f.encode_name for f in t.fields] if isinstance(t, mi.StructType) else []


def _failing_key(schema: type[Schema], data: Any, steps: list[str | int]) -> str:
    """The first key of the mapping at ``steps`` whose value does not validate."""
    mapping = _at(data, steps)
    t = _type_at(schema, steps)
    if not isinstance(mapping, Mapping) or not isinstance(t, mi.DictType):
        return "..."
    value_type = _python_type(t.value_type)
    for key, value in mapping.items():
        try:
            msgspec.convert(value, value_type, strict=True)
        except msgspec.ValidationError:
            return str(key)
    return "..."


def _python_type(t: Any) -> Any:
    return t.cls if isinstance(t, mi.StructType) else Any


class SchemaField(msgspec.Struct, frozen=True):
    """One field as help texts and option builders need it."""

    name: str
    type: Any
    required: bool
    default: Any
    description: str | None


def fields(schema: type[Schema]) -> Iterator[SchemaField]:
    """The fields of ``schema`` in declaration order, with their help text (the
    ``Meta(description=...)`` of the field's type) and default."""
    info = mi.type_info(schema)
    assert isinstance(info, mi.StructType)
    for f in info.fields:
        default = f.default if f.default is not msgspec.NODEFAULT else None
        if f.default_factory is not msgspec.NODEFAULT:
            default = f.default_factory()
        yield SchemaField(f.encode_name, f.type, f.required, default, _description(f.type))


def _description(t: Any) -> str | None:
    """The ``description`` of a ``Meta`` on the field's type, or inside ``X | None``."""
    if isinstance(t, mi.Metadata):
        described = (t.extra_json_schema or {}).get("description")
        return described if isinstance(described, str) else _description(t.type)
    if isinstance(t, mi.UnionType):
        return next((d for d in map(_description, t.types) if d), None)
    return None


def json_schema(schema: type[Schema]) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of ``schema``, for editors and docs."""
    out: dict[str, Any] = msgspec.json.schema(schema)
    return out
