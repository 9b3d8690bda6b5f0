"""The record checks every format shares: one-line ``InputError``s naming ``file:line``.

A record parser tries the plain case first (:func:`shared_fields_ok` and the format's own
type tests, no message built); only a record that fails it goes through the ``check_*``
functions, which find and name its first problem. So the two must accept the same records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from kvsim.core.errors import InputError
from kvsim.traces.model import repeated_block_id

#: what a record parser returns: (arrival_s, prompt tokens, output tokens, block ids,
#: session id or None)
RecordFields = tuple[float, int, int, tuple[int, ...], "int | None"]
#: ``parse(decoded JSON value, path, line number) -> RecordFields``; raises InputError
RecordParser = Callable[[Any, str, int], RecordFields]

_INF = math.inf


def show(v: object) -> str:
    """A value as an error message quotes it: JSON (strings in quotes), at most 40 chars."""
    s = json.dumps(v) if not isinstance(v, str) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def typename(v: object) -> str:
    """The JSON name of a decoded value's type."""
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(v), type(v).__name__)


#: a JSON value nested deeper than Python's parser recurses (``[[[[...]]]]``)
TOO_DEEP = "JSON nested too deeply to read"


def decode_error(path: str, lineno: int) -> InputError:
    return InputError("line is not valid UTF-8 text", source=path, line=lineno)


def bad_line(err: ValueError | RecursionError, path: str, lineno: int) -> InputError:
    """InputError for a line json.loads rejected (malformed JSON, JSON nested deeper than
    Python's parser goes, or bad UTF-8)."""
    if isinstance(err, RecursionError):
        return InputError(TOO_DEEP, source=path, line=lineno)
    if isinstance(err, json.JSONDecodeError):
        return InputError(
            f"malformed JSON ({err.msg}, column {err.colno})", source=path, line=lineno
        )
    return decode_error(path, lineno)


def not_object(d: object, path: str, lineno: int) -> InputError:
    return InputError(f"expected a JSON object, got {typename(d)}", source=path, line=lineno)


def check_field(
    d: dict[str, Any], key: str, ok: Callable[[Any], bool], want: str, path: str, lineno: int
) -> Any:
    """``d[key]`` when present and ``ok(value)``; else a one-line InputError saying ``want``."""
    if key not in d:
        raise InputError(f"missing field '{key}'", source=path, line=lineno)
    v = d[key]
    if not ok(v):
        raise InputError(f"field '{key}' must be {want}, got {show(v)}", source=path, line=lineno)
    return v


def check_nonneg_int(d: dict[str, Any], key: str, path: str, lineno: int) -> int:
    value: int = check_field(
        d, key, lambda v: type(v) is int and v >= 0, "a non-negative integer", path, lineno
    )
    return value


def check_int(d: dict[str, Any], key: str, path: str, lineno: int) -> int:
    value: int = check_field(d, key, lambda v: type(v) is int, "an integer", path, lineno)
    return value


def check_time(d: dict[str, Any], key: str, path: str, lineno: int) -> float:
    value: float = check_field(
        d,
        key,
        lambda v: (type(v) is int or type(v) is float) and 0 <= v < _INF,
        "a non-negative finite number",
        path,
        lineno,
    )
    return value


def check_str(d: dict[str, Any], key: str, path: str, lineno: int) -> str:
    value: str = check_field(d, key, lambda v: type(v) is str, "a string", path, lineno)
    return value


def check_ids(
    d: dict[str, Any],
    key: str,
    n_tokens: int,
    len_key: str,
    bt: int,
    path: str,
    lineno: int,
    allow_empty: bool = False,
) -> tuple[int, ...]:
    """``d[key]`` as block ids: a list of distinct integers, one per complete block of
    ``n_tokens`` (``d[len_key]``) or also the partial one; empty too when ``allow_empty``."""
    if key not in d:
        raise InputError(f"missing field '{key}'", source=path, line=lineno)
    ids = d[key]
    if type(ids) is not list:
        raise InputError(
            f"field '{key}' must be a list of integers, got {typename(ids)}",
            source=path,
            line=lineno,
        )
    for i, h in enumerate(ids):
        if type(h) is not int:
            raise InputError(
                f"field '{key}' must be a list of integers, element {i} is {show(h)}",
                source=path,
                line=lineno,
            )
    if ids or not allow_empty:
        _check_len(len(ids), n_tokens, key, len_key, bt, path, lineno)
    problem = repeated_block_id(ids)
    if problem is not None:
        raise InputError(f"field '{key}': {problem}", source=path, line=lineno)
    return tuple(ids)


def _check_len(
    n: int, n_tokens: int, key: str, len_key: str, bt: int, path: str, lineno: int
) -> None:
    full = n_tokens // bt
    ceil = -(-n_tokens // bt)
    if n != full and n != ceil:
        want = str(full) if full == ceil else f"{full} or {ceil}"
        raise InputError(
            f"field '{key}' has {n} entries but {len_key}={n_tokens} with {bt}-token blocks "
            f"needs {want}",
            source=path,
            line=lineno,
        )


def shared_fields_ok(
    ts: Any, inp: Any, out: Any, ids: Any, bt: int, allow_empty: bool = False
) -> bool:
    """The plain case's test of the fields every JSONL format has: time, lengths and block
    ids (one per complete block, or also the partial one; distinct). False sends the
    record to the ``check_*`` functions, which name the first problem."""
    if type(inp) is not int or type(out) is not int or inp < 0 or out < 0:
        return False
    if not ((type(ts) is int or type(ts) is float) and 0 <= ts < _INF) or type(ids) is not list:
        return False
    n = len(ids)
    if n != inp // bt and n != -(-inp // bt) and not (allow_empty and n == 0):
        return False
    return all(type(h) is int for h in ids) and len(set(ids)) == n
