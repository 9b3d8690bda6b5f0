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

import contextvars
import math
import numbers
import re
import reprlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import msgspec
from msgspec import inspect as mi

from kvsim.core.errors import InputError, did_you_mean

__all__ = [
    "Schema",
    "SchemaField",
    "check_fields",
    "field",
    "fields",
    "json_schema",
    "load",
    "not_finite",
    "short_repr",
]

S = TypeVar("S", bound="Schema")


class Schema(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every user-facing structure: unknown keys are errors, values are immutable,
    fields are given by name. Cross-field rules go in ``__post_init__`` and raise
    ``ValueError`` with a message that reads after the key path."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values (nested structures as dicts), e.g. for metadata."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    def with_(self: S, **changes: Any) -> S:
        """A copy with ``changes`` (checked again by ``__post_init__``)."""
        return msgspec.structs.replace(self, **changes)


_PATH = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<path>\$[^`]*)`)?$", re.S)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<key>[^`]*)`$")
_GOT_TYPE = re.compile(r", got (`[^`]*`|\d+)$")  # msgspec names the value's type; we show the value
_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = _short.maxdict = _short.maxtuple = _short.maxset = 4
_short.maxlevel = 2


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to about 60 characters and two levels: safe for any input."""
    return _short.repr(value)


def load(
    schema: type[S],
    data: Any,
    *,
    source: str | None,
    prefix: str = "",
    names: Callable[[str], str] | None = None,
) -> S:
    """``data`` (parsed JSON / YAML / keywords) as ``schema``, or a one-line
    :class:`InputError`.

    Args:
        schema: the structure to build.
        data: plain values (dicts, lists, numbers, text).
        source: what to name in an error: a file path, ``--vllm-config``, ``replay()``;
            None: the key path alone.
        prefix: a key path that ``data`` sits under in ``source`` (``options``).
        names: how an error names a top-level key (``cpu_gib`` -> ``--cpu-gib``); default
            the key itself.

    Returns:
        the validated, frozen instance.
    """
    bad = _non_finite(data, [])
    if bad is not None:
        steps, value = bad
        if names is not None and steps and isinstance(steps[0], str):
            steps[0] = names(steps[0])
        path = _dotted([*prefix.split(".")] if prefix else [], steps)
        raise not_finite(path, value, source)
    token = _LOADING.set(True)
    try:
        return msgspec.convert(data, schema, strict=True)
    except msgspec.ValidationError as exc:
        if isinstance(exc.__cause__, InputError):  # check_fields' own line, from __post_init__
            m = _PATH.match(str(exc))
            steps = [k or int(i) for k, i in _STEP.findall((m and m.group("path")) or "$")]
            path = _dotted([*prefix.split(".")] if prefix else [], steps)
            text = str(exc.__cause__)
            raise InputError(f"{path}.{text}" if path else text, source=source) from None
        raise _one_line(exc, schema, data, source, prefix, names) from None
    finally:
        _LOADING.reset(token)


#: set while :func:`load` builds a structure, so that a ``check_fields`` inside it names
#: keys as the file writes them (not as command-line flags)
_LOADING: contextvars.ContextVar[bool] = contextvars.ContextVar("loading", default=False)


def check_fields(
    obj: Schema, *, source: str | None = None, names: Callable[[str], str] | None = None
) -> None:
    """What :func:`load` checks, for an instance built in Python (``Options(x=1)``, which
    msgspec does not validate): every field's value against its declared type and bounds.
    Call it first in ``__post_init__``. A float must be finite (JSON has no infinity; a
    YAML ``.inf`` or a Python ``math.inf`` is an error here). A numpy or other ``numbers``
    scalar counts as the Python number it holds (and is stored as one), so ``np.int64(4)``
    is a valid ``int``.

    Raises:
        InputError: ``SOURCE: name: problem, got VALUE`` for the first field that fails.
    """
    if _LOADING.get():
        names = None
    for f in msgspec.structs.fields(type(obj)):
        value = getattr(obj, f.name)
        if value is f.default or (value is None and f.default is None):
            continue  # a default is valid by declaration
        plain = _plain_number(value)
        if plain is not value:
            msgspec.structs.force_setattr(obj, f.name, plain)
            value = plain
        if isinstance(value, float) and not math.isfinite(value):
            raise not_finite(names(f.encode_name) if names else f.encode_name, value, source)
        try:
            msgspec.convert(value, f.type, strict=True)
        except msgspec.ValidationError as exc:
            raise _one_line(exc, f.type, value, source, "", None, f.encode_name, names) from None


def not_finite(path: str, value: float, source: str | None) -> InputError:
    """The one rule on numbers every structure shares, worded once: no input number may be
    infinite or NaN (JSON has neither; ``1e999``, YAML's ``.inf`` and Python's ``math.inf``
    would make one). A field that means "unlimited" says so with null."""
    where = f"{path}: " if path else ""
    return InputError(f"{where}must be finite, got {value!r}", source=source)


def _non_finite(data: Any, steps: list[str | int]) -> tuple[list[str | int], float] | None:
    """The key path and value of the first infinite or NaN number in plain ``data``."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (steps, data)
    if isinstance(data, Mapping):
        items: Any = data.items()
    elif isinstance(data, (list, tuple)):
        items = enumerate(data)
    else:
        return None
    for key, value in items:
        found = _non_finite(value, [*steps, key if isinstance(key, int) else str(key)])
        if found is not None:
            return found
    return None


def _plain_number(value: Any) -> Any:
    """``value`` as a Python int / float when it is another kind of real number."""
    if type(value) in (bool, int, float) or not isinstance(value, numbers.Real):
        return value  # (np.float64 subclasses float, yet msgspec wants the float itself)
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _one_line(
    exc: msgspec.ValidationError,
    schema: Any,
    data: Any,
    source: str | None,
    prefix: str,
    names: Callable[[str], str] | None,
    field: str | None = None,
    field_names: Callable[[str], str] | None = None,
) -> InputError:
    m = _PATH.match(str(exc))
    assert m is not None  # the pattern matches any text
    msg = _GOT_TYPE.sub("", m.group("msg"))
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
        msg = "unknown key" + did_you_mean(key, _known_keys(schema, steps[:-1], data))
    elif missing := _MISSING.match(msg):
        steps.append(missing.group("key"))
        where = _dotted([*prefix.split(".")] if prefix else [], steps)
        return InputError(f"{where}: missing (a required key)", source=source)
    elif msg.startswith("Invalid value") and (tags := _tags(schema, steps[:-1])):
        msg = "must be one of " + ", ".join(tags)
    elif msg.startswith("Invalid enum value"):
        choices = _choices(_type_at(schema, steps, data))
        if choices:
            msg = "must be one of " + ", ".join(map(str, choices))
    if field is not None:  # one field's value, checked alone (check_fields)
        steps.insert(0, field)
        names = field_names
    if names is not None and steps and isinstance(steps[0], str):
        steps[0] = names(steps[0])
    path = _dotted([*prefix.split(".")] if prefix else [], steps)
    where = f"{path}: " if path else ""
    if not steps and isinstance(value, Mapping):
        # a rule between an object's keys (its __post_init__): its own message names them
        # and their values (kept whole), and the whole object would only repeat them
        return InputError(f"{where}{m.group('msg')}", source=source)
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


def _type_at(schema: Any, steps: list[str | int], data: Any = None) -> Any:
    """The msgspec type info reached by ``steps`` from ``schema`` (None where unknown); a
    tagged union's member is picked by the tag ``data`` gives there."""
    t: Any = mi.type_info(schema)
    for i, s in enumerate(steps):
        t = _unwrap(t, _at(data, steps[:i]))
        if isinstance(t, mi.StructType) and isinstance(s, str):
            t = next((f.type for f in t.fields if f.encode_name == s), None)
        elif isinstance(t, (mi.ListType, mi.TupleType, mi.VarTupleType)):
            t = getattr(t, "item_type", None)
        elif isinstance(t, mi.DictType):
            t = t.value_type
        else:
            return None
    return _unwrap(t, _at(data, steps))


def _unwrap(t: Any, value: Any = None) -> Any:
    """The struct inside ``Annotated[X, Meta]``, ``X | None`` and similar unions, if there
    is exactly one, or the member of a tagged union whose tag ``value`` gives."""
    while isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.UnionType):
        inner = [_unwrap(u) for u in t.types]
        structs = [u for u in inner if isinstance(u, (mi.StructType, mi.DictType))]
        if len(structs) == 1:
            return structs[0]
        if isinstance(value, Mapping):
            for u in structs:
                if isinstance(u, mi.StructType) and u.tag_field and value.get(u.tag_field) == u.tag:
                    return u
    return t


def _tags(schema: Any, steps: list[str | int]) -> list[str]:
    """The tags of the tagged union at ``steps`` (empty when it is not one)."""
    t: Any = _type_at(schema, steps)
    if not isinstance(t, mi.UnionType):
        return []
    members = [_unwrap(u) for u in t.types]
    return [str(u.tag) for u in members if isinstance(u, mi.StructType) and u.tag_field]


def _choices(t: Any) -> tuple[Any, ...]:
    """A ``Literal``'s values, through ``Meta`` and ``X | None``."""
    if isinstance(t, mi.Metadata):
        return _choices(t.type)
    if isinstance(t, mi.UnionType):
        return tuple(v for u in t.types for v in _choices(u))
    return tuple(t.values) if isinstance(t, mi.LiteralType) else ()


def _known_keys(schema: Any, steps: list[str | int], data: Any = None) -> list[str]:
    t = _type_at(schema, steps, data)
    return [f.encode_name for f in t.fields] if isinstance(t, mi.StructType) else []


def _failing_key(schema: Any, data: Any, steps: list[str | int]) -> str:
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
    """One field as help texts and option builders need it.

    ``kind`` is the scalar a command-line value parses to (``int``, ``float``, ``str``,
    ``bool``; None for structures), ``choices`` a ``Literal``'s values, ``extra`` the
    ``Meta(extra=...)`` of the field (e.g. ``{"aliases": ["--kv-offloading-size"]}``)."""

    name: str
    type: Any
    required: bool
    default: Any
    description: str | None
    kind: type | None = None
    choices: tuple[Any, ...] | None = None
    extra: dict[str, Any] = {}


_KINDS: dict[type, type] = {
    mi.IntType: int,
    mi.FloatType: float,
    mi.StrType: str,
    mi.BoolType: bool,
}


def fields(schema: type[Schema]) -> Iterator[SchemaField]:
    """The fields of ``schema`` in declaration order, with their help text (the
    ``Meta(description=...)`` of the field's type) and default."""
    info = mi.type_info(schema)
    assert isinstance(info, mi.StructType)
    for f in info.fields:
        default = f.default if f.default is not msgspec.NODEFAULT else None
        if f.default_factory is not msgspec.NODEFAULT:
            default = f.default_factory()
        scalar = _scalar(f.type)
        yield SchemaField(
            f.encode_name,
            f.type,
            f.required,
            default,
            _description(f.type),
            _KINDS.get(type(scalar)) if scalar is not None else None,
            tuple(scalar.values) if isinstance(scalar, mi.LiteralType) else None,
            _extra(f.type),
        )


def field(schema: type[Schema], name: str) -> SchemaField:
    """The field ``name`` of ``schema`` (a KeyError names a typo in kvsim's own code)."""
    for f in fields(schema):
        if f.name == name:
            return f
    raise KeyError(f"{schema.__name__} has no field {name!r}")


def _scalar(t: Any) -> Any:
    """The one non-None type of ``t`` (through ``Meta`` and ``X | None``), or None."""
    if isinstance(t, mi.Metadata):
        return _scalar(t.type)
    if isinstance(t, mi.UnionType):
        inner = [u for u in t.types if not isinstance(u, mi.NoneType)]
        return _scalar(inner[0]) if len(inner) == 1 else None
    if isinstance(t, mi.LiteralType):
        return t
    return t if type(t) in _KINDS else None


def _extra(t: Any) -> dict[str, Any]:
    if isinstance(t, mi.Metadata):
        return {**_extra(t.type), **(t.extra or {})}
    if isinstance(t, mi.UnionType):
        out: dict[str, Any] = {}
        for u in t.types:
            out.update(_extra(u))
        return out
    return {}


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
