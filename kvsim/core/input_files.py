"""The files a run reads, found from its option values without running it.

Two checks need them before anything runs: an output must not replace one of them (a file
an output folder will receive included), and a sweep's resume key must change when one of
them changes. Options name files in many ways (``--model config.json`` or its folder,
``--link link.json``, ``--policy mymod:MyPolicy``, ``fs:device=nvme.json`` inside a tier
shorthand, a ``vllm_config`` mapping's values), so the search is generic: every text in the
values, and every piece of it between ``:``, ``,``, ``=`` and ``+``, that names an existing
file; a folder with a ``config.json`` (a model folder); and the source file of a
``module:Class`` plugin, found on ``sys.path`` without importing it. Naming one file too
many costs a needless re-run at most; naming one too few brings stale rows back.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

_PIECES = re.compile(r"[:,=+]")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: texts longer than this are not paths (a trace given as text, a long list)
_MAX_PATH = 4096


def _texts(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > 20:  # a spec's values are shallow; anything deeper is not a file name
        return
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _texts(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _texts(v, depth + 1)


def module_file(name: str, base_dir: str | None = None) -> str | None:
    """The source file of module ``name`` as an import would find it on ``sys.path`` (the
    working directory first), without importing it or its package; None when not a plain
    source file there (an installed extension, a built-in, no such module)."""
    if not _MODULE.match(name) or name in sys.builtin_module_names:
        return None
    parts = name.split(".")
    roots = [base_dir or os.getcwd(), *(p or os.getcwd() for p in sys.path)]
    for root in roots:
        stem = os.path.join(root, *parts)
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def _path(text: str, base_dir: str | None) -> str:
    if base_dir and not os.path.isabs(text):
        return os.path.join(base_dir, text)
    return text


def _files_of(text: str, base_dir: str | None) -> Iterator[str]:
    if not text or len(text) > _MAX_PATH or "\0" in text:
        return
    for piece in {text, *_PIECES.split(text)}:
        piece = piece.strip()
        if not piece:
            continue
        path = _path(piece, base_dir)
        if os.path.isfile(path):
            yield path
        elif os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
            yield os.path.join(path, "config.json")
    module, colon, attr = text.partition(":")
    if colon and attr.isidentifier():
        found = module_file(module, base_dir)
        if found is not None:
            yield found


def referenced_files(values: Iterable[Any], base_dir: str | None = None) -> list[str]:
    """Every existing regular file the ``values`` (option values: texts, paths, mappings and
    lists of them) name, once each, in the order first named; relative paths are taken from
    ``base_dir`` (default: the working directory) and returned as joined."""
    seen: dict[str, str] = {}
    for value in values:
        for text in _texts(value):
            for path in _files_of(text, base_dir):
                seen.setdefault(os.path.realpath(path), path)
    return list(seen.values())


#: a file's stat state -> its digest: size, modification and change times (ns), inode and
#: device. No tool sets a change time back (``cp -p``, ``rsync -t`` and ``tar x`` set the
#: modification time only), so an edit always misses this memo and is hashed again.
_digests: dict[tuple[str, int, int, int, int, int], str] = {}
_HASH_BLOCK = 1 << 20


def sha256_of(path: str) -> str | None:
    """The SHA-256 of the file's bytes, read in 1 MiB blocks; None when it cannot be read.
    SHA-256: collision-resistant, and the fastest such hash here (CPUs compute it in
    hardware: about 1.2 GB/s on this project's machine, BLAKE2b 0.85)."""
    import hashlib

    h = hashlib.sha256()
    buf = bytearray(_HASH_BLOCK)
    view = memoryview(buf)
    try:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
    except OSError:
        return None
    return h.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str | None:
    """The SHA-256 of the file's bytes, hashed once per state of the file in this process;
    None when it is not a regular file that can be read (a FIFO is never opened)."""
    import stat

    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    real = os.path.realpath(path)
    state = (real, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    found = _digests.get(state)
    if found is not None:
        return found
    digest = sha256_of(path)
    if digest is None:
        return None
    if len(_digests) > 4096:
        _digests.clear()
    _digests[state] = digest
    return digest
