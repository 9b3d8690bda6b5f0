"""Output files are written whole or not at all: temp file in the same folder, then rename.

Two kinds of target are written differently, because a rename would destroy them: a
symlink is followed (the temp file goes beside the file it points to, which is replaced,
and the link stays), and an existing target that is not a regular file (``/dev/stdout``,
``/dev/null``, a FIFO) is written straight into. Any failure to write names the file.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import secrets
import stat
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import IO, Any

from kvsim.core.ending import raise_if_ending
from kvsim.core.errors import InputError


def _umask_mode() -> int:
    """The mode a plain ``open()`` would give a new file (the temporary file is made 0600).
    The umask is read from ``/proc/self/status`` where Linux gives it: setting it to read
    it back is process-wide, and a file another thread (a notebook's) made in between
    would get mode 0666."""
    return 0o666 & ~_umask()


def _umask() -> int:
    with (
        contextlib.suppress(OSError, ValueError),
        open("/proc/self/status", encoding="ascii") as f,
    ):
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)  # no /proc (macOS) or a kernel before 4.7: the only way there
    os.umask(mask)
    return mask


def _mode_of(target: str) -> int:
    """The mode a plain ``open(target, "w")`` leaves: an existing file's own (a results file
    made private with ``chmod 600`` stays so), else :func:`_umask_mode`'s."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return _umask_mode()


def _is_special(path: str) -> bool:
    """An existing target that is neither a regular file nor a folder: a device, a FIFO."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _cannot_write(path: str, exc: OSError) -> InputError:
    return InputError(f"cannot write ({exc.strerror or exc})", source=path)


def check_file_name(path: str | os.PathLike[str], option: str | None = None) -> None:
    """A file to write is not named as a folder: ``x.csv/`` (a trailing slash) would
    otherwise be written as ``x.csv``."""
    shown = os.fspath(path)
    where = f"{option}: " if option else ""
    if not shown:
        raise InputError(f"{where}an empty path; name a file")
    if shown.endswith(tuple(filter(None, (os.sep, os.altsep)))):
        raise InputError(f"{where}{shown} ends in a slash: that names a folder, not a file")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary path to write with any library; renamed onto ``path`` on success."""
    shown = os.fspath(path)
    check_file_name(shown)
    if _is_special(shown):  # /dev/stdout, /dev/null, a FIFO: a rename would replace it
        try:
            yield shown
        except OSError as exc:
            if exc.filename is not None or isinstance(exc, BrokenPipeError):
                raise  # another file's error names its own; a closed pipe ends quietly
            raise _cannot_write(shown, exc) from None  # a full device
        return
    target = os.path.realpath(shown)  # through symlinks: the link itself stays a link
    if os.path.isdir(target):
        raise InputError("is a folder, not a file", source=shown)
    folder = os.path.dirname(target)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        while tmp is None:
            # named before it is made, so a signal landing as it is made (SIGTERM, Ctrl-C)
            # finds the name here to remove; mkstemp names it only after making it
            # (its name's first 48 characters: a target named near the 255-byte limit a
            # plain open() takes would make a temporary name past it)
            name = os.path.basename(target)[:48]
            tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:  # another writer's: never ours to remove
                tmp = None
        yield tmp
        raise_if_ending()  # a SIGTERM whose exception Python dropped: never commit
        os.chmod(tmp, _mode_of(target))
        os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise _cannot_write(shown, exc) from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: str | None) -> None:
    if tmp is not None:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


@contextlib.contextmanager
def output_folder(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """The folder a command writes its files into, made on entry (so that checks of the
    files to go inside it find it). If the command fails, the folders made here that are
    still empty are removed again: a failed run leaves nothing behind, and a folder that
    existed before is never removed.

    Args:
        path: the folder, or None (nothing to make).
    """
    if path is None:
        yield
        return
    shown = os.fspath(path)
    made: list[str] = []  # the missing folders, deepest first
    folder = os.path.abspath(shown)
    while not os.path.lexists(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    try:
        os.makedirs(shown, exist_ok=True)
    except OSError as exc:
        raise _cannot_write(shown, exc) from None
    try:
        yield
    except BaseException:
        for folder in made:
            try:
                os.rmdir(folder)  # only an empty one
            except OSError:
                break
        raise


@contextlib.contextmanager
def atomic_text(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """A text file written whole or not at all; gzip-compressed (reproducibly: no timestamp,
    and no name, which would be the temporary file's random one) when ``path`` ends in
    ``.gz``, so every writer of traces agrees with the readers."""
    compress = os.fspath(path).endswith(".gz")
    with atomic_path(path) as tmp, open(tmp, "wb") as raw:
        gz = gzip.GzipFile("", mode="wb", fileobj=raw, mtime=0) if compress else None
        out = io.TextIOWrapper(gz if gz is not None else raw, "utf-8", newline="\n")
        yield out
        out.flush()
        out.detach()
        if gz is not None:
            gz.close()  # writes the gzip trailer; leaves raw open
        raw.flush()
        if stat.S_ISREG(os.fstat(raw.fileno()).st_mode):  # a pipe or a terminal has no disk
            os.fsync(raw.fileno())


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "w", **open_kwargs: Any
) -> Iterator[IO[Any]]:
    """Yield a file object; on success it replaces ``path``, on any error nothing is left."""
    with atomic_path(path) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f


FIGURE_FORMATS = ("png", "pdf", "svg")


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (links and relative paths resolved)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def refuse_overwriting_inputs(
    outputs: dict[str, str | os.PathLike[str] | None],
    inputs: list[str | os.PathLike[str] | None],
) -> None:
    """Exit 2 before any work when an output (``option -> path``) would replace an input."""
    for option, out in outputs.items():
        if out is None:
            continue
        for inp in inputs:
            if inp is not None and same_file(out, inp):
                raise InputError(
                    f"{option} {os.fspath(out)} is an input of this run; it would be overwritten"
                )


def refuse_filling_folder(
    option: str,
    folder: str | os.PathLike[str],
    receives: Callable[[str], bool],
    inputs: Iterable[str | os.PathLike[str] | None],
    folders: Collection[str] = (),
) -> None:
    """Exit 2 before any work when the output ``folder`` is a file, or when a file it will
    receive (replace, append to or remove: every name in it for which ``receives(name)``
    holds) is one of the run's ``inputs``, directly or through a link, or is a folder
    (writing it would fail after the run, with the other files written).

    Args:
        option: the folder's option, named in the error (``--out``).
        folder: the output folder; nothing to check while it does not exist.
        receives: whether a file name in the folder is one the run writes or removes.
        inputs: the run's input files (None entries are skipped).
        folders: the names the run makes as folders (a sweep's ``cells``).
    """
    where = os.fspath(folder)
    if not where:
        raise InputError(f"{option}: an empty path; name a folder")
    if os.path.exists(where) and not os.path.isdir(where):
        raise InputError(f"{option}: {where} is not a directory")
    try:
        names = [n for n in os.listdir(where) if receives(n)]
    except OSError:  # not there yet, or not readable: making it names the problem
        return
    given = [os.fspath(i) for i in inputs if i is not None]
    for name in sorted(names):
        path = os.path.join(where, name)
        if name not in folders and os.path.isdir(path):
            raise InputError(
                f"{option} {where}: {name} there is a folder, where this run writes a file; "
                "move it or use another folder"
            )
        for inp in given:
            if same_file(path, inp):
                raise InputError(
                    f"{option} {where} would overwrite {name} there, an input of this run "
                    f"({inp}); use another folder"
                )


def figure_format(path: str | os.PathLike[str], option: str = "--plot") -> str:
    """The file format a figure path asks for; checked before a run, not after it."""
    ext = os.path.splitext(os.fspath(path))[1].lstrip(".").lower() or "png"
    if ext not in FIGURE_FORMATS:
        raise InputError(
            f"{option}: cannot write a .{ext} figure; use one of {', '.join(FIGURE_FORMATS)}"
        )
    return ext


def json_text(data: Any, indent: int | None = 2) -> str:
    """``data`` as JSON every reader accepts: a NaN or infinite number (a statistic of no
    values) becomes ``null``, never Python's ``NaN`` extension, which strict readers (kvsim's
    own :func:`parse_json` included) refuse; anything else JSON lacks is its ``str``."""
    return json.dumps(_finite(data), indent=indent, default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, source: str) -> Any:
    """Parse JSON text; malformed text (and Python's NaN/Infinity extension, which no kvsim
    input may use) is a one-line :class:`InputError` naming ``source``."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})", source=source
        ) from None
    except ValueError as exc:
        raise InputError(f"not valid JSON ({exc})", source=source) from None
    except RecursionError:
        raise InputError("not valid JSON (nested too deeply to read)", source=source) from None


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file; unreadable or malformed files are a one-line :class:`InputError`."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror})", source=path) from None
    except UnicodeDecodeError:
        raise InputError("not valid JSON (not UTF-8 text)", source=path) from None
    return parse_json(text, path)


def read_yaml(path: str | os.PathLike[str], what: str) -> Any:
    """Parse a YAML file (``what`` names it in errors: "sweep spec"); a missing, unreadable,
    binary or malformed file is a one-line :class:`InputError` with the file and line."""
    import yaml

    from kvsim.core.yaml_text import load_yaml  # no aliases, no repeated keys

    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            return load_yaml(f, path)
    except FileNotFoundError:
        raise InputError(f"{what} not found", source=path) from None
    except UnicodeDecodeError:
        raise InputError(f"a {what} is YAML text, not binary", source=path) from None
    except OSError as e:  # a folder, no permission
        raise InputError(f"cannot read the {what} ({e.strerror or e})", source=path) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"bad YAML ({problem})", source=path, line=line) from None
