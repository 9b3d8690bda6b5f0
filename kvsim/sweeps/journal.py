"""A sweep's output folder as a record of finished cells: one sweep at a time writes it
(a lock), each finished row is appended to ``journal.jsonl`` and flushed at once, and a
re-run into the same folder reuses the rows journaled under the same run key.

A row is reused only if its ``cell_id`` (its configuration) and its ``run_key`` (kvsim's
version and the content of every file the cell reads: :class:`RunKeys`) both match: an
edited trace, model config, device file or policy plugin, or a new kvsim, runs the cell
again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.input_files import file_digest, referenced_files
from kvsim.report.result import kvsim_version
from kvsim.sweeps.inputs import trace_fingerprint, trace_text

JOURNAL = "journal.jsonl"
LOCK = ".sweep.lock"

#: where a skipped journal line is reported (default: :mod:`warnings`)
Warn = Callable[[str], None]


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _journal_row(line: bytes) -> dict[str, Any] | None:
    """One journal line as a row, or None when it is not one (corrupt, or no cell_id)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, nested too deeply
        return None
    if not isinstance(row, dict) or not isinstance(row.get("cell_id"), str):
        return None
    return row


def read_journal(
    folder: str | os.PathLike[str], on_warning: Warn | None = None
) -> dict[str, dict[str, Any]]:
    """cell_id -> row from ``folder/journal.jsonl``.

    A torn last line (a kill mid-write) is dropped. Any other line that is not a row (bad
    JSON, no ``cell_id``) is skipped with a one-line warning, so its cell runs again."""
    warn = on_warning or _warn
    path = os.path.join(folder, JOURNAL)
    rows: dict[str, dict[str, Any]] = {}
    if not os.path.exists(path):
        return rows
    with open(path, "rb") as f:
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):  # cut the torn tail so later appends start on a fresh line
        with open(path, "r+b") as f:
            f.truncate(len(complete))
    for number, line in enumerate(complete.splitlines(), 1):
        if not line.strip():
            continue
        row = _journal_row(line)
        if row is None:
            warn(f"{path}:{number}: skipped a line that is not a sweep row; its cell runs again")
            continue
        rows[row["cell_id"]] = row  # a later line (a retried cell) wins
    return rows


class Journal:
    """``folder/journal.jsonl`` opened for appending rows, each flushed to disk at once."""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, JOURNAL)
        try:
            os.makedirs(folder, exist_ok=True)
            self.f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise InputError(f"cannot write ({exc.strerror or exc})", source=self.path) from None

    def append(self, row: dict[str, Any]) -> None:
        """Append ``row`` and flush it to disk; a failure (a full disk, a file size limit)
        is one line naming the journal."""
        try:
            self.f.write(json.dumps(row, default=json_default, allow_nan=True) + "\n")
            self.f.flush()
            os.fsync(self.f.fileno())
        except OSError as exc:
            raise InputError(f"cannot write ({exc.strerror or exc})", source=self.path) from None

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a failed append has said why already
            self.f.close()


def json_default(v: Any) -> Any:
    """JSON for what ``json`` cannot write: numpy scalars as numbers, anything else as text."""
    if hasattr(v, "item"):
        return v.item()
    return str(v)


@contextlib.contextmanager
def folder_lock(folder: str) -> Iterator[None]:
    """One sweep per output folder: two would interleave the journal and race on the
    results. The second is refused at once; the lock goes with the process that holds it."""
    os.makedirs(folder, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no flock (Windows): unlocked
        yield
        return
    with open(os.path.join(folder, LOCK), "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise InputError(
                f"another sweep{by} is writing to this folder; "
                "wait for it to finish or use another --out",
                source=folder,
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def run_key(trace: Any, base_dir: str | None = None, version: str | None = None) -> str:
    """The run key of a cell of ``trace`` and no other option (see :class:`RunKeys`)."""
    return RunKeys(base_dir, version).key({"trace": trace})


class RunKeys:
    """A cell's run key: kvsim's version and the content of every file the cell reads (the
    trace; a model config, link, compute profile, GPU spec, tier device or vLLM config file;
    a policy plugin's module source: :func:`~kvsim.core.input_files.referenced_files`), so
    editing any of them runs the cell again. Each distinct option value is looked at once
    (a grid of a million cells has a few dozen values)."""

    def __init__(self, base_dir: str | None = None, version: str | None = None):
        self.base_dir = base_dir
        self.version = version or kvsim_version()
        self._memo: dict[str, str] = {}

    def _value(self, name: str, value: Any) -> str:
        text = f"{name}\0{trace_text(value)}"
        found = self._memo.get(text)
        if found is None:
            parts = [trace_fingerprint(value, self.base_dir)] if name == "trace" else []
            for path in referenced_files([value], self.base_dir):
                parts.append(f"{path}\0{file_digest(path) or 'unreadable'}")
            found = self._memo[text] = "\0".join(parts)
        return found

    def key(self, cell: Mapping[str, Any]) -> str:
        """The run key of ``cell`` (a configuration: trace and options)."""
        h = hashlib.sha1(self.version.encode())
        for name in sorted(cell):
            h.update(b"\1" + self._value(name, cell[name]).encode())
        return h.hexdigest()[:16]


def reusable(row: Mapping[str, Any], key: str, retry_failed: bool) -> bool:
    """A journaled row stands for its cell only if it ran on the same trace content with the
    same kvsim (rows without a key, from before keys, never really count) and, under
    ``retry_failed``, only if it succeeded."""
    if row.get("run_key") != key:
        return False
    return row.get("status") == "ok" or not retry_failed
