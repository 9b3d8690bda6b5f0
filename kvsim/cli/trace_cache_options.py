"""``--trace-cache DIR`` and ``--no-cache``: where a command keeps parsed traces, or not at
all (see :mod:`kvsim.traces.cache`). One decorator, for every command that reads traces."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import click

from kvsim.traces import cache

if TYPE_CHECKING:
    from kvsim.cli.common import FC


def trace_cache_options(f: FC) -> FC:
    """Add the two options; the command runs with them in force (in the environment, so
    sweep workers it starts follow them too), and the earlier settings come back after."""

    @functools.wraps(f)
    def run(*args: Any, trace_cache: str | None, no_cache: bool, **kwargs: Any) -> Any:
        with cache.settings(enabled=not no_cache, location=trace_cache):
            return f(*args, **kwargs)

    run = click.option(
        "--no-cache",
        is_flag=True,
        help="Parse trace files every time: no trace cache read or written.",
    )(run)
    run = click.option(
        "--trace-cache",
        type=click.Path(file_okay=False),
        default=None,
        metavar="DIR",
        help=(
            "Folder of the trace cache: parsed traces, found again by content (default "
            "$KVSIM_CACHE_DIR, else $XDG_CACHE_HOME/kvsim/traces, else "
            "~/.cache/kvsim/traces)."
        ),
    )(run)
    return run  # type: ignore[return-value]
