"""Trace readers: Mooncake JSONL, Alibaba Bailian JSONL, Azure LLM 2023 CSV, native kvsim JSONL.

A JSONL trace is read in blocks of whole lines. A block that is plainly valid is decoded in
one call (:mod:`kvsim.traces.fast_jsonl`); any other block is read line by line, one
``json.loads`` and the record checks per line, which raise :class:`kvsim.core.errors.InputError`
naming ``file:line`` (1-based; the CSV header is line 1) at the first bad record, after the
records before it. Records are kept in file order (timestamps going backwards are kept as
given). Files ending in ``.gz`` are read (and written) through :mod:`gzip` transparently.
A file read whole and without error is kept in the trace cache (:mod:`kvsim.traces.cache`),
so reading it again loads its columns instead of parsing it.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import csv
import dataclasses
import datetime as _dt
import gzip
import io
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from kvsim.core.errors import InputError
from kvsim.core.io import atomic_text

from .model import Request, Trace, TraceInfo, repeated_block_id

if TYPE_CHECKING:
    from .columns import Row, TraceColumns

TRACE_FORMATS: tuple[str, ...] = ("mooncake", "bailian", "azure", "native")

#: tokens per hash block when the file does not say (Azure has none; 512 like Mooncake).
DEFAULT_BLOCK_TOKENS = {"mooncake": 512, "bailian": 16, "azure": 512}

NATIVE_VERSION = 1
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_INF = math.inf


# --------------------------------------------------------------------------- helpers


def _open_bin(path: str) -> io.BufferedIOBase:
    """Open ``path`` for binary reading (gunzipping ``*.gz``); missing file -> InputError."""
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rb")
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError("trace file not found", source=path) from None
    except IsADirectoryError:
        raise InputError("trace path is a directory, not a file", source=path) from None
    except OSError as e:
        raise InputError(f"cannot open trace file: {e.strerror or e}", source=path) from None


def _lines(f: Iterable[bytes], path: str) -> Iterator[tuple[int, bytes]]:
    """Enumerate raw lines (1-based), turning gzip/read errors into InputError."""
    lineno = 0
    it = iter(f)
    while True:
        try:
            line = next(it)
        except StopIteration:
            return
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
            raise InputError(f"cannot read file: {e}", source=path, line=lineno + 1) from None
        lineno += 1
        yield lineno, line


def _decode_error(path: str, lineno: int) -> InputError:
    return InputError("line is not valid UTF-8 text", source=path, line=lineno)


def _bad_line(line: bytes, err: ValueError, path: str, lineno: int) -> InputError:
    """InputError for a line json.loads rejected (malformed JSON or bad UTF-8)."""
    if isinstance(err, json.JSONDecodeError):
        return InputError(
            f"malformed JSON ({err.msg}, column {err.colno})", source=path, line=lineno
        )
    return _decode_error(path, lineno)


def _show(v: object) -> str:
    s = json.dumps(v) if not isinstance(v, str) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _typename(v: object) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(v), type(v).__name__)


def _check_field(
    d: dict[str, Any], key: str, ok: Callable[[Any], bool], want: str, path: str, lineno: int
) -> Any:
    """``d[key]`` when present and ``ok(value)``; else a one-line InputError saying ``want``."""
    if key not in d:
        raise InputError(f"missing field '{key}'", source=path, line=lineno)
    v = d[key]
    if not ok(v):
        raise InputError(f"field '{key}' must be {want}, got {_show(v)}", source=path, line=lineno)
    return v


def _check_nonneg_int(d: dict[str, Any], key: str, path: str, lineno: int) -> int:
    value: int = _check_field(
        d, key, lambda v: type(v) is int and v >= 0, "a non-negative integer", path, lineno
    )
    return value


def _check_int(d: dict[str, Any], key: str, path: str, lineno: int) -> int:
    value: int = _check_field(d, key, lambda v: type(v) is int, "an integer", path, lineno)
    return value


def _check_time(d: dict[str, Any], key: str, path: str, lineno: int) -> float:
    value: float = _check_field(
        d,
        key,
        lambda v: (type(v) is int or type(v) is float) and 0 <= v < _INF,
        "a non-negative finite number",
        path,
        lineno,
    )
    return value


def _check_str(d: dict[str, Any], key: str, path: str, lineno: int) -> str:
    value: str = _check_field(d, key, lambda v: type(v) is str, "a string", path, lineno)
    return value


def _check_ids(
    d: dict[str, Any],
    key: str,
    n_tokens: int,
    len_key: str,
    bt: int,
    path: str,
    lineno: int,
    allow_empty: bool = False,
) -> tuple[int, ...]:
    if key not in d:
        raise InputError(f"missing field '{key}'", source=path, line=lineno)
    ids = d[key]
    if type(ids) is not list:
        raise InputError(
            f"field '{key}' must be a list of integers, got {_typename(ids)}",
            source=path,
            line=lineno,
        )
    for i, h in enumerate(ids):
        if type(h) is not int:
            raise InputError(
                f"field '{key}' must be a list of integers, element {i} is {_show(h)}",
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


def _not_object(d: object, path: str, lineno: int) -> InputError:
    return InputError(f"expected a JSON object, got {_typename(d)}", source=path, line=lineno)


# --------------------------------------------------------------------------- JSONL readers


# A record parser takes one decoded JSON value and returns
# (arrival_s, input_tokens, output_tokens, block_hashes, session_id), raising InputError.
RecordFields = tuple[float, int, int, tuple[int, ...], "int | None"]
RecordParser = Callable[[Any, str, int], RecordFields]


def _shared_fields_ok(
    ts: Any, inp: Any, out: Any, ids: Any, bt: int, allow_empty: bool = False
) -> bool:
    """The fast path's test of the fields every JSONL format has: time, lengths and block
    ids (one per complete block, or also the partial one; distinct). False sends the
    record to the slow path, which names the first problem."""
    if type(inp) is not int or type(out) is not int or inp < 0 or out < 0:
        return False
    if not ((type(ts) is int or type(ts) is float) and 0 <= ts < _INF) or type(ids) is not list:
        return False
    n = len(ids)
    if n != inp // bt and n != -(-inp // bt) and not (allow_empty and n == 0):
        return False
    return all(type(h) is int for h in ids) and len(set(ids)) == n


#: bytes of whole lines decoded at once
_BLOCK_BYTES = 1 << 21
#: rows per batch of the line-by-line reader
_LINE_BATCH = 4096


def _line_batches(
    lines: Iterable[tuple[int, bytes]], parse: RecordParser, path: str, first_id: int
) -> Iterator[TraceColumns]:
    """The reference reader: ``json.loads`` and the record checks per line, blank lines
    skipped; the rows in batches numbered from ``first_id``. At a bad line the rows before
    it come first, then the error naming it."""
    from .columns import from_rows

    loads = json.loads
    rows: list[Row] = []
    try:
        for lineno, line in lines:
            try:
                d = loads(line)
            except ValueError as e:
                if not line.strip():
                    continue
                raise _bad_line(line, e, path, lineno) from None
            rows.append(parse(d, path, lineno))
            if len(rows) == _LINE_BATCH:
                yield from_rows(rows, first_id)
                first_id += len(rows)
                rows = []
    except InputError:
        if rows:
            yield from_rows(rows, first_id)
        raise
    if rows:
        yield from_rows(rows, first_id)


def _blocks(f: io.BufferedIOBase) -> Iterator[bytes]:
    """``f``'s bytes in pieces of about :data:`_BLOCK_BYTES`, each ending at a line end
    (the last one may not)."""
    rest = b""
    while True:
        data = f.read(_BLOCK_BYTES)
        if not data:
            if rest:
                yield rest
            return
        if rest:
            data = rest + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # a line longer than a block: read on
            rest = data
            continue
        yield data[:cut]
        rest = data[cut:]


def _numbered(block: bytes, start: int) -> Iterator[tuple[int, bytes]]:
    """The lines of ``block`` as a binary file yields them (newline kept), numbered from
    ``start + 1``."""
    parts = block.split(b"\n")
    last = parts.pop()  # after the final newline: empty, or a last line without one
    for lineno, part in enumerate(parts, start + 1):
        yield lineno, part + b"\n"
    if last:
        yield start + len(parts) + 1, last


def _cut_header(block: bytes, start: int, path: str) -> tuple[bytes, int] | None:
    """``block`` after its first non-blank line, the native header (validated), and the
    number of the header's line; None when the block is blank."""
    pos = 0
    for lineno, line in _numbered(block, start):
        pos += len(line)
        if line.strip():
            _read_native_header(line, path)  # block_tokens already taken by open_trace
            return block[pos:], lineno
    return None


def _reread(
    path: str, parse: RecordParser, skip: int, header: bool, first_id: int
) -> Iterator[TraceColumns]:
    """Line by line from line ``skip + 1`` of a fresh read: a read error (a corrupt
    ``.gz``) is reported as the line reader reports it, with the line it stopped at."""
    with _open_bin(path) as f:
        lines = _lines(f, path)
        for _ in zip(range(skip), lines):
            pass
        if header:
            for _lineno, line in lines:
                if line.strip():
                    _read_native_header(line, path)
                    break
        yield from _line_batches(lines, parse, path, first_id)


#: blocks read ahead and decoding while the caller works on the one before
_AHEAD = 2


def _pieces(path: str, header: bool) -> Iterator[tuple[int, bytes | None, bool]]:
    """``(lines before it, block)`` per block of whole lines, the native header cut off
    (and checked); after a read error (a corrupt ``.gz``) a last ``(lines read, None,
    whether the header is still to come)``."""
    done = 0
    with _open_bin(path) as f:
        blocks = _blocks(f)
        while True:
            try:
                block = next(blocks, None)
            except (OSError, EOFError):  # gzip.BadGzipFile is an OSError
                yield done, None, header
                return
            if block is None:
                return
            start = done
            done += block.count(b"\n") + (not block.endswith(b"\n"))
            if header:
                cut = _cut_header(block, start, path)
                if cut is None:
                    continue
                block, start = cut
                header = False
            if block and not block.isspace():
                yield start, block, False


def _jsonl_blocks(path: str, fmt: str, bt: int) -> Iterator[TraceColumns]:
    """Each block decoded in one call on a helper thread (Arrow's parser lets go of the
    GIL, so the next block decodes while the caller replays this one), or read line by
    line when the fast path declines it."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from .fast_jsonl import decode_block

    parse = _PARSERS[fmt](bt)
    pieces = _pieces(path, fmt == "native")
    ahead: collections.deque[tuple[int, bytes | None, bool, Future[Any] | None]]
    ahead = collections.deque()
    rid = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvsim-decode") as decoder:

        def read_ahead() -> None:
            while len(ahead) < _AHEAD:
                piece = next(pieces, None)
                if piece is None:
                    return
                start, block, header = piece
                job = decoder.submit(decode_block, block, fmt, bt) if block else None
                ahead.append((start, block, header, job))
                if block is None:
                    return

        read_ahead()
        while ahead:
            start, block, header, job = ahead.popleft()
            read_ahead()
            if block is None or job is None:  # the file could not be read on
                yield from _reread(path, parse, start, header, rid)
                return
            batch = job.result()
            if batch is not None:
                yield dataclasses.replace(batch, first_id=rid)
                rid += len(batch)
                continue
            for batch in _line_batches(_numbered(block, start), parse, path, rid):
                rid += len(batch)
                yield batch


def _jsonl_batches(path: str, fmt: str, bt: int) -> Iterator[TraceColumns]:
    """A JSONL trace as batches: each block of lines decoded in one call when it is plainly
    valid, else line by line; a file without a request is an error."""
    n = 0
    for batch in _jsonl_blocks(path, fmt, bt):
        n += len(batch)
        yield batch
    if n == 0:
        raise InputError("no requests in trace file", source=path)


def _mooncake_parser(bt: int) -> RecordParser:
    def parse(d: Any, path: str, lineno: int) -> RecordFields:
        try:
            ts = d["timestamp"]
            inp = d["input_length"]
            out = d["output_length"]
            ids = d["hash_ids"]
        except (KeyError, TypeError, IndexError):
            ts = inp = out = ids = None
        if _shared_fields_ok(ts, inp, out, ids, bt):
            return ts / 1000.0, inp, out, tuple(ids), None
        if type(d) is not dict:
            raise _not_object(d, path, lineno)
        # slow path: find and report the first problem
        ts = _check_time(d, "timestamp", path, lineno)
        inp = _check_nonneg_int(d, "input_length", path, lineno)
        out = _check_nonneg_int(d, "output_length", path, lineno)
        ids = _check_ids(d, "hash_ids", inp, "input_length", bt, path, lineno)
        return ts / 1000.0, inp, out, ids, None

    return parse


def _bailian_parser(bt: int) -> RecordParser:
    def parse(d: Any, path: str, lineno: int) -> RecordFields:
        try:
            cid = d["chat_id"]
            pid = d["parent_chat_id"]
            ts = d["timestamp"]
            inp = d["input_length"]
            out = d["output_length"]
            typ = d["type"]
            turn = d["turn"]
            ids = d["hash_ids"]
        except (KeyError, TypeError, IndexError):
            cid = pid = ts = inp = out = typ = turn = ids = None
        if (
            type(cid) is int
            and type(pid) is int
            and type(turn) is int
            and type(typ) is str
            and _shared_fields_ok(ts, inp, out, ids, bt)
        ):
            return float(ts), inp, out, tuple(ids), cid
        if type(d) is not dict:
            raise _not_object(d, path, lineno)
        cid = _check_int(d, "chat_id", path, lineno)
        _check_int(d, "parent_chat_id", path, lineno)
        ts = _check_time(d, "timestamp", path, lineno)
        inp = _check_nonneg_int(d, "input_length", path, lineno)
        out = _check_nonneg_int(d, "output_length", path, lineno)
        _check_str(d, "type", path, lineno)
        _check_int(d, "turn", path, lineno)
        ids = _check_ids(d, "hash_ids", inp, "input_length", bt, path, lineno)
        return float(ts), inp, out, ids, cid

    return parse


def _read_native_header(line: bytes, path: str) -> int:
    """Validate the native header line; return its block_tokens."""
    try:
        h = json.loads(line)
    except ValueError as e:
        raise _bad_line(line, e, path, 1) from None
    if type(h) is not dict or "kvsim_trace" not in h:
        raise InputError(
            'first line must be the header {"kvsim_trace": 1, "block_tokens": N}',
            source=path,
            line=1,
        )
    if h["kvsim_trace"] != NATIVE_VERSION or type(h["kvsim_trace"]) is not int:
        raise InputError(
            f"unsupported kvsim_trace version {_show(h['kvsim_trace'])} "
            f"(expected {NATIVE_VERSION})",
            source=path,
            line=1,
        )
    if "block_tokens" not in h:
        raise InputError("missing field 'block_tokens' in header", source=path, line=1)
    bt = h["block_tokens"]
    if type(bt) is not int or bt <= 0:
        raise InputError(
            f"field 'block_tokens' must be a positive integer, got {_show(bt)}", source=path, line=1
        )
    return bt


def _native_parser(bt: int, prompt: str = "input_tokens") -> RecordParser:
    """Native records; ``prompt`` names the prompt-length field (a DataFrame's column is
    ``prompt_tokens``, the file format's field ``input_tokens``)."""

    def parse(d: Any, path: str, lineno: int) -> RecordFields:
        try:
            ts = d["arrival_s"]
            inp = d[prompt]
            out = d["output_tokens"]
            ids = d["block_hashes"]
            sid = d.get("session_id")
        except (KeyError, TypeError, IndexError, AttributeError):
            ts = inp = out = ids = sid = None
        if (sid is None or type(sid) is int) and _shared_fields_ok(
            ts, inp, out, ids, bt, allow_empty=True
        ):
            return float(ts), inp, out, tuple(ids), sid
        if type(d) is not dict:
            raise _not_object(d, path, lineno)
        ts = _check_time(d, "arrival_s", path, lineno)
        inp = _check_nonneg_int(d, prompt, path, lineno)
        out = _check_nonneg_int(d, "output_tokens", path, lineno)
        sid = d.get("session_id")
        if sid is not None and type(sid) is not int:
            raise InputError(
                f"field 'session_id' must be an integer or null, got {_show(sid)}",
                source=path,
                line=lineno,
            )
        ids = _check_ids(d, "block_hashes", inp, prompt, bt, path, lineno, True)
        return float(ts), inp, out, ids, sid

    return parse


def native_record_parser(block_tokens: int, prompt: str = "input_tokens") -> RecordParser:
    """The checks of the native format's records, for requests that come from elsewhere (a
    DataFrame, whose prompt column is named ``prompt``): same fields, same one-line errors."""
    return _native_parser(block_tokens, prompt)


_PARSERS: dict[str, Callable[[int], RecordParser]] = {
    "mooncake": _mooncake_parser,
    "bailian": _bailian_parser,
    "native": _native_parser,
}


# --------------------------------------------------------------------------- Azure CSV

_AZ_TS = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)")


def _azure_time(s: str, path: str, lineno: int) -> tuple[int, float]:
    """Parse ``2023-11-16 18:17:03.9799600`` (any number of fractional digits).

    Returns (day ordinal, seconds within the day) so differences keep full precision.
    """
    m = _AZ_TS.fullmatch(s.strip())
    bad = m is None
    if m is not None:
        y, mo, dd, hh, mi, ss = m.groups()
        try:
            day = _dt.date(int(y), int(mo), int(dd)).toordinal()
        except ValueError:
            bad = True
        else:
            h, mn, sec = int(hh), int(mi), float(ss)
            bad = h > 23 or mn > 59 or sec >= 61.0
    if bad:
        raise InputError(
            f"column 'TIMESTAMP' must look like 2023-11-16 18:17:03.9799600, got {_show(s)}",
            source=path,
            line=lineno,
        )
    return day, h * 3600 + mn * 60 + sec


def _azure_int(s: str, col: str, path: str, lineno: int) -> int:
    t = s.strip()
    if t.isascii() and t.isdigit():
        return int(t)
    raise InputError(
        f"column '{col}' must be a non-negative integer, got {_show(s)}", source=path, line=lineno
    )


def _decoded(lines: Iterator[tuple[int, bytes]], path: str) -> Iterator[str]:
    for lineno, raw in lines:
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _decode_error(path, lineno) from None


def _iter_azure(path: str, bt: int, limit: int | None) -> Iterator[Request]:
    rid = 0
    if limit == 0:
        return
    with _open_bin(path) as f:
        header_seen = False
        day0 = 0
        sod0 = 0.0
        reader = csv.reader(_decoded(_lines(f, path), path))
        for row in reader:
            lineno = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if not header_seen:
                cells = tuple(c.strip().lstrip("\ufeff") for c in row)
                if cells != AZURE_HEADER:
                    raise InputError(
                        f"expected CSV header {','.join(AZURE_HEADER)}, got {_show(','.join(row))}",
                        source=path,
                        line=lineno,
                    )
                header_seen = True
                continue
            if len(row) != 3:
                raise InputError(
                    f"expected 3 columns ({','.join(AZURE_HEADER)}), got {len(row)}",
                    source=path,
                    line=lineno,
                )
            day, sod = _azure_time(row[0], path, lineno)
            inp = _azure_int(row[1], "ContextTokens", path, lineno)
            out = _azure_int(row[2], "GeneratedTokens", path, lineno)
            if rid == 0:
                day0, sod0 = day, sod
            yield Request(rid, round((day - day0) * 86400 + (sod - sod0), 7), inp, out, ())
            rid += 1
            if rid == limit:
                return
    if rid == 0:
        raise InputError("no requests in trace file", source=path)


def _request_batches(requests: Iterator[Request]) -> Iterator[TraceColumns]:
    """Requests in column batches; at an error, the batch before it first."""
    from .columns import from_requests

    rows: list[Request] = []
    try:
        for r in requests:
            rows.append(r)
            if len(rows) == _LINE_BATCH:
                yield from_requests(rows)
                rows = []
    except InputError:
        if rows:
            yield from_requests(rows)
        raise
    if rows:
        yield from_requests(rows)


def _azure_batches(path: str, fmt: str, bt: int) -> Iterator[TraceColumns]:
    return _request_batches(_iter_azure(path, bt, None))


def read_batches(path: str, fmt: str, block_tokens: int) -> Iterator[TraceColumns]:
    """Parse the ``fmt`` trace file at ``path`` whole, as column batches (no cache)."""
    if fmt == "azure":
        return _azure_batches(path, fmt, block_tokens)
    return _jsonl_batches(path, fmt, block_tokens)


# --------------------------------------------------------------------------- sniffing / open


def _first_line(path: str) -> tuple[int, bytes | None]:
    with _open_bin(path) as f:
        for lineno, line in _lines(f, path):
            if line.strip():
                return lineno, line
    return 0, None


def sniff_format(path: str) -> str:
    """Guess a trace file's format from its extension and first non-blank line."""
    base = path[:-3] if path.endswith(".gz") else path
    if base.lower().endswith(".csv"):
        _open_bin(path).close()  # missing file -> InputError
        return "azure"
    lineno, line = _first_line(path)
    if line is None:
        raise InputError("no requests in trace file (file is empty)", source=path)
    if line.removeprefix(b"\xef\xbb\xbf").startswith(b"TIMESTAMP,"):
        return "azure"
    try:
        d = json.loads(line)
    except ValueError as e:
        raise InputError(
            f"cannot determine trace format: first line is not JSON ({getattr(e, 'msg', e)})",
            source=path,
            line=lineno,
        ) from None
    if type(d) is dict:
        if "kvsim_trace" in d:
            return "native"
        if "chat_id" in d:
            return "bailian"
        if "hash_ids" in d and "input_length" in d:
            return "mooncake"
    raise InputError(
        "cannot determine trace format from the first line; pass fmt= one of "
        + ", ".join(TRACE_FORMATS),
        source=path,
        line=lineno,
    )


_SPOOLED: dict[str, str] = {}  # stream name -> its copy, so a second open reads the copy


def _remove_spooled() -> None:
    for name in _SPOOLED.values():
        with contextlib.suppress(OSError):
            os.unlink(name)


def _spool_stream(shown: str) -> str:
    """A regular file to read ``shown`` from, as often as needed.

    Standard input (``-``), a FIFO or a process substitution (``<(cat t.jsonl)``) can be
    read only once, but a trace is opened to sniff its format and then streamed (and a timed
    run may stream it twice): such an input is copied once to a temporary file, removed
    when the process exits. A regular file is read in place.
    """
    if shown in _SPOOLED:
        return _SPOOLED[shown]
    if shown != "-":
        try:
            mode = os.stat(shown).st_mode
        except OSError:
            return shown  # missing: the reader names it
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            return shown
    base = os.path.basename(shown) if shown != "-" else "stdin"
    suffix = "".join(s for s in (".csv", ".gz") if s in base.lower()) or ".jsonl"
    fd, tmp = tempfile.mkstemp(prefix="kvsim-trace-", suffix=suffix)
    if not _SPOOLED:
        atexit.register(_remove_spooled)
    _SPOOLED[shown] = tmp
    try:
        with os.fdopen(fd, "wb") as out:
            if shown == "-":
                shutil.copyfileobj(sys.stdin.buffer, out)
            else:
                with open(shown, "rb") as src:
                    shutil.copyfileobj(src, out)
    except OSError as exc:
        raise InputError(f"cannot read trace: {exc.strerror or exc}", source=shown) from None
    return tmp


def open_trace(
    path: str | os.PathLike[str],
    fmt: str | None = None,
    block_tokens: int | None = None,
    limit: int | None = None,
) -> Trace:
    """Open a trace file for streaming.

    ``fmt`` is one of :data:`TRACE_FORMATS`, or None to sniff it (``.csv`` -> azure; JSONL with a
    ``{"kvsim_trace": 1, ...}`` header -> native, ``chat_id`` -> bailian, ``hash_ids`` +
    ``input_length`` -> mooncake). ``block_tokens`` overrides the format's block size (Mooncake
    512, Bailian 16, native: from the header, Azure: 512). ``limit`` caps the number of requests.
    Only the first line is read here; records are validated as they are iterated, or loaded
    from the trace cache when this content was read before (:mod:`kvsim.traces.cache`).
    ``-`` reads standard input; a FIFO or ``<(...)`` works too (cached by content alike).
    """
    shown = os.fspath(path)
    p = _spool_stream(shown)
    if fmt is None:
        fmt = sniff_format(p)
    elif fmt not in TRACE_FORMATS:
        raise InputError(
            f"unknown trace format {fmt!r}; expected one of {', '.join(TRACE_FORMATS)}"
        )
    else:
        _open_bin(p).close()  # missing file -> InputError now, not at first iteration
    if limit is not None and (type(limit) is not int or limit < 0):
        raise InputError(f"limit must be a non-negative integer, got {limit!r}")
    if block_tokens is not None and (type(block_tokens) is not int or block_tokens <= 0):
        raise InputError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    if fmt == "native":
        lineno, line = _first_line(p)
        if line is None:
            raise InputError("no requests in trace file (file is empty)", source=p)
        if lineno != 1:
            raise InputError(
                'first line must be the header {"kvsim_trace": 1, "block_tokens": N}',
                source=p,
                line=1,
            )
        bt = _read_native_header(line, p)
    else:
        bt = DEFAULT_BLOCK_TOKENS[fmt]
    if block_tokens is not None:
        bt = block_tokens
    info = TraceInfo(path=shown, format=fmt, block_tokens=bt, has_reuse_info=fmt != "azure")
    from .source import FileSource

    return Trace(info, limit, FileSource(p, fmt, bt, read_batches))


# --------------------------------------------------------------------------- writer


def write_native(
    path: str | os.PathLike[str], requests: Iterable[Request], block_tokens: int
) -> int:
    """Write ``requests`` as a native kvsim JSONL trace, atomically; return the request count.

    The data goes to a temporary file in the destination directory that replaces ``path`` only
    once complete, so readers never see a half-written trace. A ``.gz`` path is gzip-compressed.
    ``request_id`` is not stored (it is the 0-based line order on reading).
    """
    if type(block_tokens) is not int or block_tokens <= 0:
        raise InputError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    n = 0
    with atomic_text(path) as out:
        dumps = json.dumps
        out.write(dumps({"kvsim_trace": NATIVE_VERSION, "block_tokens": block_tokens}) + "\n")
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
