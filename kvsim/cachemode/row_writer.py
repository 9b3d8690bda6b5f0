"""Per-request rows written as CSV by Arrow's C++ CSV writer, a batch at a time.

Formatting a row (ten values, one a float) in Python costs about as much as replaying its
request's blocks in a plain ``kvsim replay``; Arrow's writer formats a batch of columns in
C++ (``pyarrow.csv.CSVWriter``, one record batch per call). Numbers are written as Arrow
writes them (the shortest text that reads back as the same value: ``0`` for an arrival at
0 s, ``0.00001``), booleans as ``true`` / ``false``, the header unquoted and lines ending in
``\n``, as every table kvsim writes (:mod:`kvsim.report.tables`); pandas, Arrow and
:mod:`csv` read the file back to the same values. The caller's
:func:`~kvsim.core.io.atomic_path` makes the file whole or absent.
"""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: Arrow type name -> the :mod:`array` typecode its values are packed with
_TYPECODES = {"int64": "q", "double": "d"}


@contextlib.contextmanager
def csv_rows(
    path: str, columns: Sequence[tuple[str, str]], gzip: bool = False
) -> Iterator[Callable[[list[tuple[Any, ...]]], object]]:
    """A sink for batches of rows written to ``path`` (opened anew) under a header of the
    columns' names; ``columns`` are ``(name, Arrow type name)`` (``int64``, ``double``,
    ``bool``), the rows tuples in that order; ``gzip``: the file is gzipped (a name
    ending in ``.gz`` says so, which ``path``, a temporary name, may not). Only a run that
    writes rows loads pyarrow.

    Raises ``TypeError`` for a value that is not of its column's type, ``OSError`` when
    the file cannot be written."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    schema = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in columns])
    kinds = [kind for _, kind in columns]
    options = pa_csv.WriteOptions(quoting_style="none", quoting_header="none")
    with contextlib.ExitStack() as stack:  # the writer closes first, then the gzip stream
        sink = stack.enter_context(pa.CompressedOutputStream(path, "gzip")) if gzip else path
        writer = stack.enter_context(pa_csv.CSVWriter(sink, schema, write_options=options))

        def write(rows: list[tuple[Any, ...]]) -> None:
            if rows:
                n = len(rows)
                arrays = [
                    pa.Array.from_buffers(t, n, [None, pa.py_buffer(_packed(values, kind))])
                    for values, kind, t in zip(zip(*rows), kinds, schema.types)
                ]
                writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))

        yield write


def _packed(values: Sequence[Any], kind: str) -> bytes:
    """A column's values as Arrow's data buffer: packed numbers, or a bitmap (bit ``i``
    of the little-endian bytes is ``values[i]``). Packed in C (:mod:`array`, ``int``):
    ``pyarrow.array`` on a Python list would import pandas, a second a run."""
    if kind == "bool":
        bits = "".join(["1" if v else "0" for v in reversed(values)])
        return int(bits, 2).to_bytes((len(values) + 7) // 8, "little")
    return array(_TYPECODES[kind], values).tobytes()
