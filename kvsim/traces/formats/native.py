"""kvsim's own JSONL traces: a header ``{"kvsim_trace": 1, "block_tokens": N}``, then one
record per line (``arrival_s`` in seconds, ``input_tokens``, ``output_tokens``,
``block_hashes``, optional ``session_id``). The format ``kvsim trace convert`` and
:func:`write_native` write."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.io import atomic_text
from kvsim.traces.model import Request

from .checks import (
    RecordFields,
    RecordParser,
    bad_line,
    check_ids,
    check_nonneg_int,
    check_time,
    not_object,
    shared_fields_ok,
    show,
)
from .files import first_line
from .jsonl import JsonlLayout, jsonl_reader
from .registry import Sniff, TraceFormat, register

VERSION = 1
_HEADER_SHAPE = 'first line must be the header {"kvsim_trace": 1, "block_tokens": N}'

LAYOUT = JsonlLayout(
    arrival="arrival_s",
    prompt="input_tokens",
    output="output_tokens",
    hashes="block_hashes",
    session="session_id",
    session_optional=True,
    empty_hashes=True,
)


def read_header(line: bytes, path: str) -> int:
    """Validate the header line; return its block_tokens."""
    try:
        h = json.loads(line)
    except ValueError as e:
        raise bad_line(e, path, 1) from None
    if type(h) is not dict or "kvsim_trace" not in h:
        raise InputError(_HEADER_SHAPE, source=path, line=1)
    if h["kvsim_trace"] != VERSION or type(h["kvsim_trace"]) is not int:
        raise InputError(
            f"unsupported kvsim_trace version {show(h['kvsim_trace'])} (expected {VERSION})",
            source=path,
            line=1,
        )
    if "block_tokens" not in h:
        raise InputError("missing field 'block_tokens' in header", source=path, line=1)
    bt = h["block_tokens"]
    if type(bt) is not int or bt <= 0:
        raise InputError(
            f"field 'block_tokens' must be a positive integer, got {show(bt)}", source=path, line=1
        )
    return bt


def stated_block_tokens(path: str) -> int:
    """The block size the file's header states (the header must be line 1)."""
    lineno, line = first_line(path)
    if line is None:
        raise InputError("no requests in trace file (file is empty)", source=path)
    if lineno != 1:
        raise InputError(_HEADER_SHAPE, source=path, line=1)
    return read_header(line, path)


def stated_stages(path: str) -> list[int] | None:
    """The first request of each load stage (an empty stage repeats the next one's), where
    the header states them
    (``"stage_starts": [0, 4800]``, written by ``kvsim trace gen shared-prefix`` /
    ``random``), else None; a bad list is a one-line error."""
    lineno, line = first_line(path)
    if line is None or lineno != 1:
        return None
    try:
        h = json.loads(line)
    except ValueError:
        return None
    starts = h.get("stage_starts") if type(h) is dict else None
    if starts is None:
        return None
    if (
        type(starts) is not list
        or not starts
        or starts[0] != 0
        or any(type(s) is not int for s in starts)
        or any(a > b for a, b in itertools.pairwise(starts))
    ):
        raise InputError(
            "header field 'stage_starts' must be non-decreasing request indices from 0, got "
            + show(starts),
            source=path,
            line=1,
        )
    return list(starts)


def record_parser(block_tokens: int, prompt: str = "input_tokens") -> RecordParser:
    """The checks of the native format's records; ``prompt`` names the prompt-length field
    (the file's is ``input_tokens``; a requests DataFrame's column is ``prompt_tokens``, and
    :func:`kvsim.traces.coerce.frame_requests` checks its rows with the same one-line errors)."""
    bt = block_tokens

    def parse(d: Any, path: str, lineno: int) -> RecordFields:
        try:
            ts = d["arrival_s"]
            inp = d[prompt]
            out = d["output_tokens"]
            ids = d["block_hashes"]
            sid = d.get("session_id")
        except (KeyError, TypeError, IndexError, AttributeError):
            ts = inp = out = ids = sid = None
        if (sid is None or type(sid) is int) and shared_fields_ok(
            ts, inp, out, ids, bt, allow_empty=True
        ):
            return float(ts), inp, out, tuple(ids), sid
        if type(d) is not dict:
            raise not_object(d, path, lineno)
        ts = check_time(d, "arrival_s", path, lineno)
        inp = check_nonneg_int(d, prompt, path, lineno)
        out = check_nonneg_int(d, "output_tokens", path, lineno)
        sid = d.get("session_id")
        if sid is not None and type(sid) is not int:
            raise InputError(
                f"field 'session_id' must be an integer or null, got {show(sid)}",
                source=path,
                line=lineno,
            )
        ids = check_ids(d, "block_hashes", inp, prompt, bt, path, lineno, True)
        return float(ts), inp, out, ids, sid

    return parse


def write_native(
    path: str | os.PathLike[str],
    requests: Iterable[Request],
    block_tokens: int,
    header: dict[str, Any] | None = None,
) -> int:
    """Write ``requests`` as a native kvsim JSONL trace, atomically; return the request count.

    The data goes to a temporary file in the destination directory that replaces ``path`` only
    once complete, so readers never see a half-written trace. A ``.gz`` path is gzip-compressed.
    ``request_id`` is not stored (it is the 0-based line order on reading). ``header``
    adds keys to the header line (``stage_starts``, a generator's description).
    """
    if type(block_tokens) is not int or block_tokens <= 0:
        raise InputError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    n = 0
    with atomic_text(path) as out:
        dumps = json.dumps
        head = {"kvsim_trace": VERSION, "block_tokens": block_tokens, **(header or {})}
        out.write(dumps(head) + "\n")
        for r in requests:
            rec = {
                "arrival_s": r.arrival_s,
                "input_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "block_hashes": list(r.block_hashes),
            }
            if r.session_id is not None:
                rec["session_id"] = r.session_id
            out.write(dumps(rec, separators=(",", ":")) + "\n")
            n += 1
    return n


FORMAT = register(
    TraceFormat(
        "native",
        jsonl_reader(record_parser, LAYOUT, header=read_header),
        stated_block_tokens=stated_block_tokens,
        sniff=Sniff(record=lambda d: "kvsim_trace" in d, rank=0),
    )
)
