"""Where a sweep's cells run: in this process (``serial``), on a pool of worker processes
(``local``, the default) or on a Ray cluster (``ray``). Each executor takes the cells and
yields one row per cell as it finishes, in any order; none raises for a failing cell.

The local pool runs one cell per worker at a time, so that a worker's death (an OOM kill)
is charged to exactly the cell it was running: the dead worker is replaced and only its cell
runs again, and after :data:`CRASH_LIMIT` deaths that cell is recorded as failed. Workers
die with the sweep's main process, however it ends.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from kvsim.core.errors import InputError
from kvsim.core.processes import become_worker, driver_pid, how_it_died
from kvsim.sweeps.cells import cell_id, failed_row, run_cell

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

#: the executors by name (``kvsim sweep --executor``)
EXECUTORS = ("local", "serial", "ray")
#: a cell whose worker process dies this many times is recorded as failed (fewer: re-run)
CRASH_LIMIT = 2
#: what a pool worker sends when it starts a cell, before its row
STARTED = "started"

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


def _worker_main(
    conn: Connection, base_dir: str, parent_pid: int | None, requests_dir: str | None = None
) -> None:
    """A pool worker: cells in, rows out, one at a time, until told to stop (``None``)."""
    become_worker(parent_pid)
    sys.stdout = sys.stderr  # a plugin's print() is not the sweep's output
    while True:
        try:
            cell = conn.recv()
        except (EOFError, OSError):
            return
        if cell is None:
            return
        try:
            conn.send(STARTED)  # the cell's clock starts now, not at the worker's start-up
        except OSError:
            return
        row = run_cell(cell, base_dir, requests_dir)
        try:
            conn.send(row)
        except OSError:  # the driver is gone
            return


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    cell: dict[str, Any] | None = None  # the cell it is running
    started: float | None = None  # when it started that cell (time.monotonic)


class _Pool:
    """Worker processes that each run one cell at a time, so a worker's death (an OOM kill)
    is charged to exactly the cell it was running, and to no other.

    ``ProcessPoolExecutor`` fails every pending cell when one worker dies; here the dead
    worker is replaced and only its cell is queued again; after :data:`CRASH_LIMIT` deaths
    that cell is recorded as failed and the rest of the sweep goes on. With a ``timeout``,
    a worker still on its cell after that many seconds is killed and the cell recorded as
    failed (a plugin in an endless loop stops one cell, not the sweep). Cells are taken
    from their iterator only as workers free up, so a large grid is never held whole."""

    def __init__(
        self,
        size: int,
        base_dir: str,
        timeout: float | None = None,
        requests_dir: str | None = None,
    ):
        self.ctx = multiprocessing.get_context()
        self.size = size
        self.base_dir = base_dir
        self.timeout = timeout
        self.requests_dir = requests_dir
        self.running: list[_Worker] = []
        self.idle: list[_Worker] = []
        self.crashes: Counter[str] = Counter()
        self.parent_pid = driver_pid(self.ctx)

    def run(self, cells: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        source = iter(cells)
        again: deque[dict[str, Any]] = deque()  # cells whose worker died: run last
        while True:
            while len(self.running) < self.size:
                cell = next(source, None)
                if cell is None and again:
                    cell = again.popleft()
                if cell is None:
                    break
                self._hand(self.idle.pop() if self.idle else self._spawn(), cell)
            if not self.running:
                break
            for worker in self._ready():
                yield from self._collect(worker, again)
            yield from self._overdue()
        self._stop_idle()

    def _spawn(self) -> _Worker:
        ours, theirs = self.ctx.Pipe()
        process = self.ctx.Process(
            target=_worker_main,
            args=(theirs, self.base_dir, self.parent_pid, self.requests_dir),
            name="kvsim-sweep-worker",
            daemon=True,
        )
        process.start()
        theirs.close()
        return _Worker(process, ours)

    def _hand(self, worker: _Worker, cell: dict[str, Any]) -> None:
        worker.cell = cell
        worker.started = None  # until the worker says it has started
        self.running.append(worker)
        with contextlib.suppress(OSError):  # died idle: its sentinel reports it next
            worker.conn.send(cell)

    def _ready(self) -> list[_Worker]:
        """Running workers with a row to read or a death to report (none when the first
        deadline passes first)."""
        by_handle: dict[Any, _Worker] = {}
        for w in self.running:
            by_handle[w.conn] = w
            by_handle[w.process.sentinel] = w
        wait_s = None
        clocks = [w.started for w in self.running if w.started is not None]
        if self.timeout is not None and clocks:
            wait_s = max(0.0, min(clocks) + self.timeout - time.monotonic())
        ready = wait(list(by_handle), timeout=wait_s)
        return list({id(by_handle[h]): by_handle[h] for h in ready}.values())

    def _overdue(self) -> Iterator[dict[str, Any]]:
        """Kill each worker past its cell's deadline; its cell is a failed row."""
        if self.timeout is None:
            return
        now, limit = time.monotonic(), self.timeout
        over = [w for w in self.running if w.started is not None and now - w.started >= limit]
        for worker in over:
            self.running.remove(worker)
            cell, worker.cell = worker.cell, None
            assert cell is not None
            worker.process.kill()
            self._discard(worker)
            yield failed_row(cell, f"the cell ran longer than its timeout of {self.timeout:g} s")

    def _collect(self, worker: _Worker, queue: deque[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if self._started(worker):
            return
        self.running.remove(worker)
        cell, worker.cell = worker.cell, None
        assert cell is not None
        row = self._receive(worker)
        if row is not None:
            if worker.process.is_alive():
                self.idle.append(worker)
            else:
                self._discard(worker)
            yield row
            return
        self._discard(worker)
        cid = cell_id(cell)
        self.crashes[cid] += 1
        if self.crashes[cid] < CRASH_LIMIT:
            queue.append(cell)  # not this cell's fault yet: run it again, last
            return
        how = how_it_died(worker.process.exitcode)
        yield failed_row(
            cell, f"the process running this cell died ({how}), {self.crashes[cid]} times"
        )

    @staticmethod
    def _started(worker: _Worker) -> bool:
        """Whether the worker's message is that it started its cell (its clock set)."""
        if worker.started is not None or not worker.process.is_alive():
            return False
        try:
            if worker.conn.poll() and worker.conn.recv() == STARTED:
                worker.started = time.monotonic()
                return True
        except Exception:  # EOF, or a message cut short by a death: the sentinel reports it
            return False
        return False

    @staticmethod
    def _receive(worker: _Worker) -> dict[str, Any] | None:
        """The worker's row, or None when it died without one."""
        try:
            while worker.conn.poll():
                row: dict[str, Any] | str = worker.conn.recv()
                if row != STARTED:
                    return row  # type: ignore[return-value]
        except Exception:  # EOF, or a message cut short by the death
            return None
        return None

    @staticmethod
    def _discard(worker: _Worker, timeout: float = 5.0) -> None:
        worker.process.join(timeout)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.conn.close()

    def _stop_idle(self) -> None:
        for worker in self.idle:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in self.idle:
            self._discard(worker)
        self.idle.clear()

    def close(self) -> None:
        """Interrupted (or done): stop every worker at once; queued cells stay not run."""
        for worker in self.running + self.idle:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in self.running + self.idle:
            self._discard(worker, timeout=2.0)
        self.running.clear()
        self.idle.clear()


def _run_local(
    cells: Iterable[dict[str, Any]],
    base_dir: str,
    workers: int,
    address: str | None,
    timeout: float | None = None,
    requests_dir: str | None = None,
) -> Iterator[dict[str, Any]]:
    pool = _Pool(workers, base_dir, timeout, requests_dir)
    try:
        yield from pool.run(cells)
    finally:
        pool.close()


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
