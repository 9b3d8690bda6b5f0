"""The trace cache: a parsed trace's columns on disk, found again by the file's content.

Decoding a JSONL trace costs a pass of JSON parsing and checks over every line; loading its
columns (:class:`~kvsim.traces.columns.TraceColumns`) costs a small fraction of that. Once a
trace has been read whole and without error, its columns are stored as one file
(:mod:`kvsim.traces.cache_file`) whose name is a hash of: the SHA-256 digest of the file's
bytes, the format and block size it was read with, and a digest of the kvsim code that
decides what a trace reads as (with the package's ``__init__``, which states kvsim's
version). A later read hashes the file again and looks for that name, so a changed file
(even one of the same size and modification time), other reading options or another kvsim
look for another entry: a stale entry is never used. An entry restates its key inside and
ends with a CRC-32 of its bytes: a truncated, corrupt or mismatched entry is ignored (and
replaced by the next successful read), never trusted. No entry is written for a read that
failed or stopped early, so the cache never hides a malformed line.

Where: ``$KVSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvsim/traces``, else
``~/.cache/kvsim/traces``; ``KVSIM_NO_CACHE=1`` turns it off (nothing read or written).
Never the trace's own folder: an entry that would land beside the trace is not written.
An entry is written to a temporary file and renamed (:func:`kvsim.core.io.atomic_write`),
so processes reading and writing at once (sweep workers) never see half of one; two
writers of one entry write the same columns.

Within one process the last trace read stays in memory too (keyed the same way), so sweep
cells that share a trace parse it, or load it, once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kvsim.core.errors import InputError
from kvsim.core.input_files import sha256_of
from kvsim.core.io import atomic_write

from .cache_file import read, read_records, write

if TYPE_CHECKING:
    from .columns import Record, TraceColumns

_T = TypeVar("_T")

ENV_FOLDER = "KVSIM_CACHE_DIR"
ENV_OFF = "KVSIM_NO_CACHE"
#: bumped when the entry layout changes
ENTRY_FORMAT = 1
#: the modules whose code decides what a trace reads as (their source is part of the key)
_READER_CODE = (
    "../__init__.py",
    "readers.py",
    "formats/*.py",
    "fast_jsonl.py",
    "columns.py",
    "source.py",
    "cache.py",
    "cache_file.py",
    "model.py",
)

#: what happened, for tests and curious users: hits (from disk), memory_hits, misses,
#: stores, rejected (entries ignored as corrupt or mismatched)
STATS: Counter[str] = Counter()

#: a trace's columns: consecutive batches (as parsed), or one table (as loaded)
Parts = Sequence["TraceColumns"]

_last: tuple[str, Parts] | None = None  # the most recent trace: (entry name, its columns)


def folder() -> str | None:
    """The cache folder, or None when the cache is off."""
    if os.environ.get(ENV_OFF, "").strip() not in ("", "0"):
        return None
    chosen = os.environ.get(ENV_FOLDER)
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvsim", "traces")


@contextlib.contextmanager
def settings(
    *, enabled: bool = True, location: str | os.PathLike[str] | None = None
) -> Iterator[None]:
    """Use (or turn off) the cache at ``location`` for the duration of the block.

    Set in the environment, so that processes started meanwhile (sweep workers) follow."""
    saved = {k: os.environ.get(k) for k in (ENV_FOLDER, ENV_OFF)}
    if location is not None:
        os.environ[ENV_FOLDER] = os.fspath(location)
    if not enabled:
        os.environ[ENV_OFF] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: what changes whenever a file's bytes may have: size, modification and change times
#: (ns; writing a file sets its change time, which no tool can set back), inode, device
FileState = tuple[int, int, int, int, int]


def file_state(path: str) -> FileState | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def file_digest(path: str) -> str | None:
    """The SHA-256 digest of the file's bytes (as stored: a ``.gz`` file's compressed bytes),
    or None when it cannot be read (the reader then reports why)."""
    return sha256_of(path)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A digest of kvsim's ``__init__`` (which states its version) and of the reader code:
    an entry written by another release, or by an edited checkout, is never read."""
    h = hashlib.blake2b(digest_size=12)
    here = Path(__file__).parent
    for pattern in _READER_CODE:
        for path in sorted(here.glob(pattern)) or [here / pattern]:
            try:
                h.update(path.read_bytes())
            except OSError:
                h.update(pattern.encode())
    return h.hexdigest()


def _key(digest: str, fmt: str, block_tokens: int) -> dict[str, Any]:
    return {
        "entry_format": ENTRY_FORMAT,
        "kvsim": code_version(),
        "content_sha256": digest,
        "format": fmt,
        "block_tokens": block_tokens,
    }


def _name(key: dict[str, Any]) -> str:
    text = json.dumps(key, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest() + ".columns"


def _from_folder(
    digest: str | None, fmt: str, block_tokens: int, read: Callable[..., _T]
) -> _T | None:
    """``read(path, key)`` of the entry for this content and reading in the cache folder;
    None when there is none, or none sound (counted in :data:`STATS`)."""
    if digest is None:
        return None
    where = folder()
    if where is None:
        STATS["misses"] += 1
        return None
    key = _key(digest, fmt, block_tokens)
    try:
        found = read(os.path.join(where, _name(key)), key)
    except FileNotFoundError:
        STATS["misses"] += 1
        return None
    except (OSError, ValueError):  # truncated, corrupt, not an entry, another key
        STATS["rejected"] += 1
        STATS["misses"] += 1
        return None
    STATS["hits"] += 1
    return found


def remembered(digest: str | None, fmt: str, block_tokens: int) -> Parts | None:
    """The columns of this content and reading if they are the ones kept in memory."""
    if digest is None or _last is None or _last[0] != _name(_key(digest, fmt, block_tokens)):
        return None
    STATS["memory_hits"] += 1
    return _last[1]


def lookup(digest: str | None, fmt: str, block_tokens: int) -> Parts | None:
    """The columns stored for this content and reading, from memory or the cache folder."""
    parts = remembered(digest, fmt, block_tokens)
    if parts is not None:
        return parts
    columns = _from_folder(digest, fmt, block_tokens, read)
    if columns is None:
        return None
    assert digest is not None
    _remember(_name(_key(digest, fmt, block_tokens)), [columns])
    return [columns]


def lookup_records(
    digest: str | None, fmt: str, block_tokens: int, limit: int | None
) -> Iterator[Record] | None:
    """The first ``limit`` stored rows as plain records, read from the cache folder
    without numpy (what a replay loop reads); not kept in memory."""
    return _from_folder(digest, fmt, block_tokens, functools.partial(read_records, limit=limit))


def _remember(name: str, parts: Parts) -> None:
    global _last
    _last = (name, parts)


def forget() -> None:
    """Drop the in-memory copy (the folder is left alone)."""
    global _last
    _last = None


def store(digest: str, fmt: str, block_tokens: int, parts: Parts, trace_path: str) -> None:
    """Keep ``parts``, read whole from a file whose bytes have ``digest``: in memory, and
    in the cache folder when it is on (quietly skipped when it cannot be written)."""
    key = _key(digest, fmt, block_tokens)
    name = _name(key)
    _remember(name, parts)
    where = folder()
    if where is None or _beside(where, trace_path):
        return
    if not all(p.fixed_width() for p in parts):  # ids beyond 64 bits: memory only
        return
    _write(os.path.join(where, name), key, parts)


def _beside(where: str, trace_path: str) -> bool:
    trace_dir = os.path.dirname(os.path.abspath(trace_path))
    try:
        return os.path.samefile(where, trace_dir)
    except OSError:
        return os.path.realpath(where) == os.path.realpath(trace_dir)


def _write(path: str, key: dict[str, Any], parts: Parts) -> None:
    """Write the entry whole or not at all (:mod:`kvsim.core.io`); a read-only or full disk
    only costs the next read its parse, so a failure to write is not an error here."""
    with contextlib.suppress(OSError):
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO, a device or a link there:
            os.unlink(path)  # replaced, never written into (a FIFO would block)
    try:
        with atomic_write(path, "wb") as f:
            write(f, key, parts)
    except InputError:  # io names the file and the OS error; the trace was read all the same
        return
    STATS["stores"] += 1
