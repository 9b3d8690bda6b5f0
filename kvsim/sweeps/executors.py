"""Where a sweep's cells run: in this process (``serial``), on a pool of worker processes
(``local``, the default) or on a Ray cluster (``ray``). Each executor takes the cells and
yields one row per cell as it finishes, in any order; none raises for a failing cell.

The local pool (:func:`kvsim.core.worker_pool.run_tasks`) runs one cell per worker at a
time, so that a worker's death (an OOM kill) is charged to exactly the cell it was running:
the dead worker is replaced and only its cell runs again, and after :data:`CRASH_LIMIT`
deaths that cell is recorded as failed. With a per-cell timeout, a worker still on its cell
after that many seconds is killed and the cell recorded as failed (a plugin in an endless
loop stops one cell, not the sweep). Cells are taken from their iterator only as workers
free up, so a large grid is never held whole. Workers die with the sweep's main process,
however it ends.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.worker_pool import Failure, run_tasks
from kvsim.sweeps.cells import failed_row, run_cell

#: the executors by name (``kvsim sweep --executor``)
EXECUTORS = ("local", "serial", "ray")
#: a cell whose worker process dies this many times is recorded as failed (fewer: re-run)
CRASH_LIMIT = 2

#: an executor: (cells, the driver's working directory, workers, Ray address, per-cell
#: timeout in seconds or None, the sweep folder that keeps each cell's requests table or
#: None) -> rows; the cells are taken one at a time as workers free up
Executor = Callable[
    [Iterable[dict[str, Any]], str, int, "str | None", "float | None", "str | None"],
    Iterator[dict[str, Any]],
]


def check_timeout(seconds: float | None, name: str) -> None:
    """A per-cell timeout is a positive number of seconds, for the ``local`` executor (its
    cells run in processes that can be killed; a cell in this process cannot be stopped)."""
    if seconds is None:
        return
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise InputError(f"cell timeout must be a number of seconds > 0, got {seconds!r}")
    if name != "local":
        raise InputError(f"a cell timeout needs the local executor, not {name!r}")


def executor(name: str) -> Executor:
    """The executor called ``name`` (one of :data:`EXECUTORS`)."""
    return _EXECUTORS[name]


def _run_serial(
    cells: Iterable[dict[str, Any]],
    base_dir: str,
    workers: int,
    address: str | None,
    timeout: float | None = None,
    requests_dir: str | None = None,
) -> Iterator[dict[str, Any]]:
    for c in cells:
        yield run_cell(c, base_dir, requests_dir)


def _run_local(
    cells: Iterable[dict[str, Any]],
    base_dir: str,
    workers: int,
    address: str | None,
    timeout: float | None = None,
    requests_dir: str | None = None,
) -> Iterator[dict[str, Any]]:
    return run_tasks(
        _run_cell_in_worker,
        (base_dir, requests_dir),
        cells,
        workers=workers,
        on_failure=_failed,
        deaths_to_fail=CRASH_LIMIT,
        timeout=timeout,
        name="kvsim-sweep-worker",
    )


def _run_cell_in_worker(
    cell: dict[str, Any], base_dir: str, requests_dir: str | None
) -> dict[str, Any]:
    """In a pool worker: one cell's row; a plugin's print() is not the sweep's output."""
    sys.stdout = sys.stderr
    return run_cell(cell, base_dir, requests_dir)


def _failed(cell: dict[str, Any], failure: Failure) -> dict[str, Any]:
    """The row of a cell that ran past its timeout, or whose worker died too often."""
    if failure.timeout is not None:
        return failed_row(cell, f"the cell ran longer than its timeout of {failure.timeout:g} s")
    return failed_row(
        cell, f"the process running this cell died ({failure.how}), {failure.deaths} times"
    )


def import_ray() -> Any:
    """Ray, or the one-line error saying how to install it (checked before a sweep makes
    its folder)."""
    try:
        import ray
    except ImportError:
        raise InputError("the ray executor needs Ray: pip install 'kvsim[ray]'") from None
    return ray


def _run_ray(
    cells: Iterable[dict[str, Any]],
    base_dir: str,
    workers: int,
    address: str | None,
    timeout: float | None = None,
    requests_dir: str | None = None,
) -> Iterator[dict[str, Any]]:
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        here = os.path.abspath(__file__)  # kvsim/sweeps/executors.py: the root holds kvsim
        root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        kwargs: dict[str, Any] = {
            "runtime_env": {"env_vars": {"PYTHONPATH": path}},
            "include_dashboard": False,
            "log_to_driver": False,
        }
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=workers, **kwargs)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(run_cell)
        of = {remote.remote(c, base_dir, requests_dir): c for c in cells}
        pending = list(of)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    row = ray.get(ref)
                except ray.exceptions.RayError as e:  # Ray has retried a dead worker already
                    row = failed_row(of[ref], f"{type(e).__name__}: {e}")
                yield row
    finally:
        if started:
            ray.shutdown()


_EXECUTORS: dict[str, Executor] = {
    "serial": _run_serial,
    "local": _run_local,
    "ray": _run_ray,
}
