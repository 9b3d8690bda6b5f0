"""Anything a user may call a trace (a path, a :class:`Trace`, a requests DataFrame, a list
of requests) becomes a :class:`Trace` here, so every entry point accepts the same things."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvsim.core.errors import InputError

from .formats.native import record_parser
from .model import Request, Trace
from .readers import open_trace

if TYPE_CHECKING:
    from typing import TypeAlias, TypeGuard

    import pandas as pd

    #: what every entry point accepts as a trace
    TraceLike: TypeAlias = str | os.PathLike[str] | Trace | Iterable[Request] | pd.DataFrame

REQUEST_FIELDS = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "block_hashes",
    "session_id",
)


def requests_frame(requests: Iterable[Request], block_tokens: int) -> pd.DataFrame:
    """Requests as a DataFrame (one row each, the :class:`Request` fields as columns).

    ``frame.attrs["block_tokens"]`` keeps the hash-block size, so the frame can be passed
    back to ``replay`` / ``simulate`` as a trace.
    """
    import pandas as pd

    frame = pd.DataFrame.from_records(
        [
            (
                r.request_id,
                r.arrival_s,
                r.prompt_tokens,
                r.output_tokens,
                r.block_hashes,
                r.session_id,
            )
            for r in requests
        ],
        columns=list(REQUEST_FIELDS),
    )
    frame.attrs["block_tokens"] = block_tokens
    return frame


def _plain(value: Any) -> Any:
    """numpy scalars as the Python values a JSON reader would have produced."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "ndim", 1) == 0 else value


def frame_requests(frame: pd.DataFrame, block_tokens: int = 512) -> list[Request]:
    """The requests of a DataFrame shaped like :func:`requests_frame`'s, each row checked as
    a trace file's line is (negative tokens, a hash list that does not fit the prompt, a
    fractional id are one-line errors naming the row, never silently truncated). A frame
    from before the rename, with ``input_tokens`` for ``prompt_tokens``, is read too."""
    old_name = "prompt_tokens" not in frame and "input_tokens" in frame
    prompt = "input_tokens" if old_name else "prompt_tokens"
    missing = [
        c for c in ("arrival_s", prompt, "output_tokens", "block_hashes") if c not in frame.columns
    ]
    if missing:
        raise InputError(f"a requests DataFrame needs the columns {', '.join(missing)}")
    ids = _integers(frame, "request_id") if "request_id" in frame else range(len(frame))
    sessions = frame["session_id"] if "session_id" in frame else [None] * len(frame)
    parse = record_parser(block_tokens, prompt)
    out = []
    for row, (i, t, n_in, n_out, hashes, s) in enumerate(
        zip(
            ids,
            frame["arrival_s"],
            _integers(frame, prompt),
            _integers(frame, "output_tokens"),
            frame["block_hashes"],
            sessions,
        )
    ):
        s = _plain(s)
        if isinstance(s, float) and s.is_integer():  # ints beside None: pandas made them floats
            s = int(s)
        record = {
            "arrival_s": _plain(t),
            prompt: _plain(n_in),
            "output_tokens": _plain(n_out),
            "block_hashes": [_plain(h) for h in hashes] if hashes is not None else None,
            "session_id": None if s is None or s != s else s,
        }
        fields = parse(record, "requests DataFrame row", row)
        out.append(Request(int(_plain(i)), *fields))
    return out


def _integers(frame: pd.DataFrame, name: str) -> Any:
    """Column ``name`` of integers as integers. One missing value makes pandas store a
    whole integer column as floats: then the first row that is not a whole number (the NaN)
    is the one named, not row 0 with a value that looks right (``1194.0``)."""
    column = frame[name]
    if column.dtype.kind != "f":
        return column
    import numpy as np

    values = column.to_numpy()
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values != np.floor(values))
    if bad.any():
        row = int(np.argmax(bad))
        raise InputError(
            f"field {name!r} must be a non-negative integer, got {float(values[row])!r} "
            "(a float column: pandas stores integers beside a missing value as floats)",
            source="requests DataFrame row",
            line=row,
        )
    return [int(v) for v in values]


def _is_frame(obj: Any) -> TypeGuard[pd.DataFrame]:
    # A DataFrame exists only once pandas is imported: no need to import it to ask.
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(obj, pd.DataFrame)


def as_trace(
    trace: TraceLike,
    *,
    block_tokens: int | None = None,
    limit: int | None = None,
    fmt: str | None = None,
) -> Trace:
    """Accept a path, a :class:`Trace`, a requests DataFrame, or a list of requests."""
    if _is_frame(trace):
        bt = block_tokens or trace.attrs.get("block_tokens", 512)
        return as_trace(Trace.from_requests(frame_requests(trace, bt), bt), limit=limit)
    if isinstance(trace, Trace):
        return trace.with_limit(limit) if limit is not None else trace
    if isinstance(trace, (str, os.PathLike)):
        return open_trace(trace, fmt=fmt, block_tokens=block_tokens, limit=limit)
    if isinstance(trace, (bytes, int, float)) or not hasattr(trace, "__iter__"):
        raise InputError(
            "a trace is a file path, a Trace, a requests DataFrame or a list of Requests, "
            f"got {type(trace).__name__}"
        )
    items = list(trace)
    wrong = next((r for r in items if not isinstance(r, Request)), None)
    if wrong is not None:
        raise InputError(f"a list trace holds Requests, got a {type(wrong).__name__}")
    t = Trace.from_requests(items, block_tokens or 512)
    return t.with_limit(limit) if limit is not None else t
