"""Records to column batches, with the one rule every reader keeps at a bad record: the
rows before it come out first, then the error that names it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from kvsim.core.errors import InputError

from .checks import RecordParser, bad_line

if TYPE_CHECKING:
    from kvsim.traces.columns import Row, TraceColumns
    from kvsim.traces.model import Request

#: rows per batch of the line-by-line readers
LINE_BATCH = 4096


def line_batches(
    lines: Iterable[tuple[int, bytes]], parse: RecordParser, path: str, first_id: int
) -> Iterator[TraceColumns]:
    """The reference reader: ``json.loads`` and the record checks per line, blank lines
    skipped; the rows in batches numbered from ``first_id``. At a bad line the rows before
    it come first, then the error naming it."""
    from kvsim.traces.columns import from_rows

    loads = json.loads
    rows: list[Row] = []
    try:
        for lineno, line in lines:
            try:
                d = loads(line)
            except (ValueError, RecursionError) as e:
                if not line.strip():
                    continue
                raise bad_line(e, path, lineno) from None
            rows.append(parse(d, path, lineno))
            if len(rows) == LINE_BATCH:
                yield from_rows(rows, first_id)
                first_id += len(rows)
                rows = []
    except InputError:
        if rows:
            yield from_rows(rows, first_id)
        raise
    if rows:
        yield from_rows(rows, first_id)


def request_batches(requests: Iterator[Request]) -> Iterator[TraceColumns]:
    """Requests in column batches; at an error, the batch before it first."""
    from kvsim.traces.columns import from_requests

    rows: list[Request] = []
    try:
        for r in requests:
            rows.append(r)
            if len(rows) == LINE_BATCH:
                yield from_requests(rows)
                rows = []
    except InputError:
        if rows:
            yield from_requests(rows)
        raise
    if rows:
        yield from_requests(rows)
