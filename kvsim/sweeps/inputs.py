"""A sweep's traces at run time: a path (relative to the driver's working directory) or a
generator mapping (``{kind: chat, n_requests: 500, seed: 1}``), as a row label, as what
``replay`` / ``simulate`` read, and as a fingerprint of its content for resume keys."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.input_files import file_digest

#: the last generated trace (its mapping as JSON -> requests): cells that share a generator
#: in one process generate it once
_generated: dict[str, Any] = {}


def trace_label(trace: Any) -> str:
    """The ``trace`` column of a row: the path as written, or ``gen:KIND(n=..,seed=..)``."""
    if isinstance(trace, Mapping):
        from kvsim.traces.synthetic import WorkloadSpec

        return WorkloadSpec.from_mapping(trace).label()
    return str(trace)


def trace_text(trace: Any) -> str:
    """One text per distinct trace entry (mappings in key order): a dictionary key."""
    return json.dumps(trace, sort_keys=True, default=str)


def resolve_trace(trace: Any, base_dir: str | None) -> Any:
    """What a cell hands ``replay`` / ``simulate``: a path joined to ``base_dir`` when
    relative, or a generator's requests (generated once per process for consecutive cells)."""
    if isinstance(trace, Mapping):
        from kvsim.traces.synthetic import WorkloadSpec

        label = trace_text(trace)
        if label not in _generated:
            _generated.clear()
            _generated[label] = WorkloadSpec.from_mapping(trace).requests()
        return _generated[label]
    path = os.fspath(trace)
    if base_dir and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    return path


def trace_fingerprint(trace: Any, base_dir: str | None = None) -> str:
    """What a trace's rows depend on beyond its path: the SHA-256 of its bytes (hashed once
    per state of the file in a process: :func:`kvsim.core.input_files.file_digest`), so an
    edit anywhere, size and modification time kept or not, changes it.

    A generator's output is fixed by its mapping (part of the cell); a missing file's key
    changes once it exists; a FIFO or device cannot be fingerprinted, so it never matches."""
    if isinstance(trace, Mapping):
        return "generated"
    path = resolve_trace(trace, base_dir)
    if not os.path.exists(path):
        return "missing"
    return file_digest(path) or f"unfingerprintable:{time.time_ns()}"


def check_traces(
    traces: list[Any], base_dir: str | None, limit: int | None, block_tokens: list[Any]
) -> None:
    """Read each trace file the cells read, at each ``block_tokens`` they read it with
    (None: the format's), before any cell runs: a missing file or a bad line is one
    :class:`InputError` naming ``traces[i]``, not a grid of failed cells. Each read lands
    in the trace cache, so the cells do not parse it again. Generators are checked with
    the spec."""
    from kvsim.traces import as_trace
    from kvsim.traces.cache import forget

    forget()  # read through this sweep's cache folder, not a copy an earlier run kept
    for i, trace in enumerate(traces):
        if isinstance(trace, Mapping):
            continue
        path = resolve_trace(trace, base_dir)
        for tokens in block_tokens:
            try:
                for _ in as_trace(path, block_tokens=tokens, limit=limit):
                    pass
            except InputError as e:
                raise InputError(f"traces[{i}]: {e}") from None
