"""Decode a block of JSONL trace lines in one call (Arrow's JSON reader), checked column-wise.

A fast path only: :func:`decode_block` returns None whenever the block is not plainly
valid — a line Arrow rejects, a missing or null field, a number out of range, a hash list of
the wrong length or with a repeated id, two objects on one line, bytes that are not UTF-8 —
and the caller then reads that block line by line with the per-record checks of
:mod:`kvsim.traces.formats`, which name the first bad line and its problem. So the fast path
decides nothing on its own: it accepts exactly what the line reader accepts, with the same
values (``tests/traces/test_trace_cache.py`` compares the two on random and mutated lines).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .columns import TraceColumns
from .formats.jsonl_layout import JsonlLayout

_SCHEMAS: dict[JsonlLayout, Any] = {}


def _schema(layout: JsonlLayout) -> Any:
    if layout not in _SCHEMAS:
        import pyarrow as pa

        fields = [(layout.arrival, pa.float64()), (layout.prompt, pa.int64())]
        fields += [(layout.output, pa.int64()), (layout.hashes, pa.list_(pa.int64()))]
        session = (layout.session,) if layout.session else ()
        fields += [(name, pa.int64()) for name in session + layout.ints]
        fields += [(name, pa.string()) for name in layout.texts]
        _SCHEMAS[layout] = pa.schema(fields)
    return _SCHEMAS[layout]


#: two JSON values on one line (``}{``, ``} {``, ``}\r{``): the line reader rejects such a
#: line, Arrow would read two rows. A match inside a string only costs the fast path.
_TWO_OBJECTS = re.compile(rb"\}[ \t\r]*\{")


def _plain_text(block: bytes) -> bool:
    """UTF-8 without NUL bytes (the line reader rejects both; Arrow is laxer about them)."""
    if b"\x00" in block:
        return False
    if block.isascii():
        return True
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read(block: bytes, layout: JsonlLayout) -> Any:
    import pyarrow as pa
    import pyarrow.json as pj

    try:
        return pj.read_json(
            pa.py_buffer(block),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(len(block) + 1, 1 << 16)),
            parse_options=pj.ParseOptions(
                explicit_schema=_schema(layout), unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _column(table: Any, name: str) -> Any:
    """A column as one array, or None when it has a null (a missing field, or JSON null)."""
    col = table.column(name).combine_chunks()
    return None if col.null_count else col


def _numbers(arr: Any, dtype: type[np.generic]) -> np.ndarray:
    """A null-free int64/float64 Arrow array as numpy, from its value buffer. Arrow's own
    ``to_numpy`` loads pandas (0.4 s) for its compatibility shim; a first read needs none."""
    values = arr.buffers()[1]
    return np.frombuffer(values, dtype, count=len(arr), offset=arr.offset * 8)


def _flags(arr: Any) -> np.ndarray:
    """A boolean Arrow array (a bitmap, least significant bit first) as numpy bools."""
    bits = np.frombuffer(arr.buffers()[1], np.uint8)
    return np.unpackbits(bits, bitorder="little")[arr.offset : arr.offset + len(arr)].astype(bool)


def _distinct_within_rows(hashes: np.ndarray, lengths: np.ndarray) -> bool:
    """No id repeats inside one request (ids may repeat across requests)."""
    if len(hashes) < 2:
        return True
    rising = np.diff(hashes) > 0
    starts = np.cumsum(lengths)[:-1]  # where rows 1.. begin: no pair across them counts
    rising[starts[(starts > 0) & (starts < len(hashes))] - 1] = True
    if rising.all():  # ids rise within every row (as traces number them): all distinct
        return True
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    lo, hi = int(hashes.min()), int(hashes.max())
    span = hi - lo + 1
    if span * len(lengths) < (1 << 62):  # one sortable key: row, then id
        key = np.sort(rows * span + (hashes - lo))
        return not bool((key[1:] == key[:-1]).any())
    order = np.lexsort((hashes, rows))
    h, r = hashes[order], rows[order]
    return not bool(((h[1:] == h[:-1]) & (r[1:] == r[:-1])).any())


def decode_block(block: bytes, layout: JsonlLayout, block_tokens: int) -> TraceColumns | None:
    """The requests of ``block`` (whole lines of a JSONL trace whose records ``layout``
    describes, no header; ids from 0), or None when the line reader must judge it."""
    if not _plain_text(block) or _TWO_OBJECTS.search(block):
        return None
    table = _read(block, layout)
    if table is None:  # now each non-blank line is one row, or Arrow has refused the block
        return None
    names = (layout.arrival, layout.prompt, layout.output, layout.hashes)
    cols = [_column(table, name) for name in (*names, *layout.ints, *layout.texts)]
    if any(c is None for c in cols):
        return None
    arrival = _numbers(cols[0], np.float64)
    n_in, n_out = (_numbers(c, np.int64) for c in cols[1:3])
    ids = cols[3]
    values = ids.flatten()
    if values.null_count:
        return None
    offsets = np.frombuffer(ids.buffers()[1], np.int32, len(ids) + 1, ids.offset * 4)
    offsets = offsets.astype(np.int64)
    offsets -= offsets[0]
    hashes = _numbers(values, np.int64)
    lengths = np.diff(offsets)
    bt = block_tokens
    if not (np.isfinite(arrival).all() and (arrival >= 0).all()):
        return None
    if not ((n_in >= 0).all() and (n_out >= 0).all()):
        return None
    fits = (lengths == n_in // bt) | (lengths == -(-n_in // bt))
    if layout.empty_hashes:
        fits |= lengths == 0
    if not fits.all() or not _distinct_within_rows(hashes, lengths):
        return None
    n = table.num_rows
    session = np.zeros(n, np.int64)
    has_session = np.zeros(n, np.bool_)
    if layout.session is not None:
        sid = table.column(layout.session).combine_chunks()
        if sid.null_count and not layout.session_optional:
            return None
        has_session = _flags(sid.is_valid())
        session = _numbers(sid.fill_null(0), np.int64)
    scale = layout.time_scale
    return TraceColumns(
        arrival_s=arrival / scale if scale else arrival.astype(np.float64, copy=True),
        prompt_tokens=n_in.astype(np.int64, copy=False),
        output_tokens=n_out.astype(np.int64, copy=False),
        offsets=offsets,
        hashes=hashes,
        session_id=session,
        has_session=has_session,
    )
