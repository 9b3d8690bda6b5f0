"""One pool of worker processes for every caller that runs independent tasks in parallel: a
sweep's cells (``sweeps/executors.py``) and an accuracy run's experiments
(``accuracy/parallel.py``).

Why a pool of its own: ``multiprocessing.Pool`` loses the task of a worker that dies (an OOM
kill) and waits for it forever, or wedges on the queue lock the dead worker held, and
``ProcessPoolExecutor`` fails every pending task when one worker dies. Here each worker runs
one task at a time over a pipe of its own, so a death is charged to exactly the task it was
running: the dead worker is replaced and that task runs again, or counts as failed, as the
caller chooses. Workers die with their driver (:mod:`kvsim.core.processes`), however it ends.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from kvsim.core.processes import become_worker, driver_pid, how_it_died

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext
    from multiprocessing.process import BaseProcess

__all__ = ["Failure", "run_tasks"]

T = TypeVar("T")
R = TypeVar("R")

#: what a worker sends when it starts a task, before its answer (the task's clock starts then,
#: not at the worker's start-up)
_STARTED = "started"
#: an answer's kinds: ``(_DONE, result)`` or ``(_RAISED, exception)``
_DONE, _RAISED = "done", "raised"


@dataclass(frozen=True)
class Failure:
    """Why a task has no result of its own, for the caller's ``on_failure``.

    Attributes:
        how: how its last worker died, in :func:`~kvsim.core.processes.how_it_died`'s words
            (``killed by SIGKILL``; a timed-out worker is one the pool killed).
        deaths: how many of its workers died on their own while running it.
        timeout: the seconds it ran past, when the pool killed it for that; None when its
            worker died on its own."""

    how: str
    deaths: int
    timeout: float | None = None


def run_tasks(
    task: Callable[..., R],
    args: tuple[Any, ...],
    items: Iterable[T],
    *,
    workers: int,
    on_failure: Callable[[T, Failure], R],
    in_order: bool = False,
    deaths_to_fail: int = 1,
    timeout: float | None = None,
    name: str = "kvsim-worker",
    context: BaseContext | None = None,
) -> Iterator[R]:
    """``task(item, *args)`` for each of ``items``, on up to ``workers`` worker processes.

    Args:
        task: a module-level function (it is pickled by name under spawn and forkserver); it
            runs in a worker, with SIGINT ignored there (Ctrl-C is the driver's). What it
            returns must pickle; what it raises is raised again here, and the pool stops.
        args: ``task``'s arguments after the item, the same for every item, sent once to
            each worker.
        items: the tasks' inputs, taken one at a time as workers free up, so a large
            iterable is never held whole.
        workers: the most worker processes at once (>= 1); started only as items need them.
        on_failure: called here with an item and its :class:`Failure` for the result of a
            task whose worker died ``deaths_to_fail`` times, or that ran past ``timeout``.
        in_order: results in ``items``' order; False: each as it finishes.
        deaths_to_fail: how many worker deaths a task may cause before it counts as failed;
            an item whose worker died fewer times runs again, after the other items.
        timeout: seconds a task may run (from when its worker starts it) before its worker
            is killed and the task counts as failed; None: no limit.
        name: the worker processes' name.
        context: the multiprocessing context to start them with; None: the default.

    Returns:
        A generator of one result per item (``task``'s, or ``on_failure``'s). Closing it
        early (an error, Ctrl-C, a consumer that stops) stops every worker; items not yet
        taken are never run.

    Invariants:
        each item runs on one worker at a time; a worker's death is charged to that item
        alone; no worker outlives the generator, nor the driver process."""
    pool: _Pool[T, R] = _Pool(
        task,
        args,
        workers,
        on_failure,
        deaths_to_fail,
        timeout,
        name,
        context or multiprocessing.get_context(),
    )
    try:
        yield from pool.run(items, in_order)
    finally:
        pool.close()


def _worker_main(
    conn: Connection, task: Callable[..., Any], args: tuple[Any, ...], parent_pid: int | None
) -> None:
    """A worker: an item in, ``_STARTED`` and its answer out, one at a time, until told to
    stop (``None``) or its driver is gone."""
    become_worker(parent_pid)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        try:
            conn.send(_STARTED)
        except OSError:
            return
        try:
            answer: tuple[str, Any] = (_DONE, task(message[0], *args))
        except Exception as exc:
            answer = (_RAISED, exc)
        try:
            conn.send(answer)
        except OSError:  # the driver is gone
            return
        except Exception as exc:  # an answer that does not pickle
            conn.send((_RAISED, RuntimeError(f"{type(exc).__name__}: {exc}")))


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    index: int = -1  # the position of the item it is running, in the caller's items
    item: Any = None
    started: float | None = None  # when it started that item (time.monotonic)


class _Pool(Generic[T, R]):
    """The workers of one :func:`run_tasks` call: who is running what, who is idle, and how
    many times each item's worker died."""

    def __init__(
        self,
        task: Callable[..., R],
        args: tuple[Any, ...],
        size: int,
        on_failure: Callable[[T, Failure], R],
        deaths_to_fail: int,
        timeout: float | None,
        name: str,
        context: BaseContext,
    ) -> None:
        self.context = context
        self.worker_args = (task, args, driver_pid(context))
        self.size = size
        self.on_failure = on_failure
        self.deaths_to_fail = deaths_to_fail
        self.timeout = timeout
        self.name = name
        self.running: list[_Worker] = []
        self.idle: list[_Worker] = []
        self.deaths: Counter[int] = Counter()

    def run(self, items: Iterable[T], in_order: bool) -> Iterator[R]:
        """Each item's result, in ``items``' order or as it finishes."""
        source = enumerate(items)
        again: deque[tuple[int, T]] = deque()  # items whose worker died: run last
        finished: dict[int, R] = {}
        following = 0  # in order: the index of the next result to yield
        while True:
            while len(self.running) < self.size:
                taken = next(source, None) or (again.popleft() if again else None)
                if taken is None:
                    break
                self._hand(self._idle_or_new(), *taken)
            if not self.running:
                break
            for index, result in [*self._collect(again), *self._overdue()]:
                if not in_order:
                    yield result
                    continue
                finished[index] = result
                while following in finished:
                    yield finished.pop(following)
                    following += 1
        self._stop_idle()

    def _spawn(self) -> _Worker:
        ours, theirs = self.context.Pipe()
        process = self.context.Process(  # type: ignore[attr-defined]
            target=_worker_main, args=(theirs, *self.worker_args), name=self.name, daemon=True
        )
        process.start()
        theirs.close()
        return _Worker(process, ours)

    def _idle_or_new(self) -> _Worker:
        """An idle worker still alive, or a new one: one that died idle (the OOM killer
        picks a large process, busy or not) is not handed an item its death would fail."""
        while self.idle:
            worker = self.idle.pop()
            if worker.process.is_alive():
                return worker
            self._discard(worker)
        return self._spawn()

    def _hand(self, worker: _Worker, index: int, item: T) -> None:
        worker.index, worker.item = index, item
        worker.started = None  # until the worker says it has started
        self.running.append(worker)
        with contextlib.suppress(OSError):  # died idle: its sentinel reports it next
            worker.conn.send((item,))

    def _ready(self) -> list[_Worker]:
        """Running workers with a message to read or a death to report (none when the first
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

    def _collect(self, again: deque[tuple[int, T]]) -> list[tuple[int, R]]:
        """The results of the workers that answered or died, with their items' indices; an
        item whose worker died fewer than ``deaths_to_fail`` times goes to ``again``."""
        results = []
        for worker in self._ready():
            if self._started(worker):
                continue
            self.running.remove(worker)
            index, item = worker.index, worker.item
            answer = self._receive(worker)
            if answer is not None:
                if worker.process.is_alive():
                    self.idle.append(worker)  # one that died after answering takes no more
                else:
                    self._discard(worker)
                kind, value = answer
                if kind == _RAISED:
                    raise value
                results.append((index, value))
                continue
            self._discard(worker)
            self.deaths[index] += 1
            if self.deaths[index] < self.deaths_to_fail:
                again.append((index, item))  # not this item's fault yet: run it again, last
                continue
            failure = Failure(how_it_died(worker.process.exitcode), self.deaths[index])
            results.append((index, self.on_failure(item, failure)))
        return results

    def _overdue(self) -> list[tuple[int, R]]:
        """Kill each worker past its item's deadline; its item's result is a failure."""
        if self.timeout is None:
            return []
        now, limit = time.monotonic(), self.timeout
        over = [w for w in self.running if w.started is not None and now - w.started >= limit]
        results = []
        for worker in over:
            self.running.remove(worker)
            worker.process.kill()
            self._discard(worker)
            how = how_it_died(worker.process.exitcode)
            failure = Failure(how, self.deaths[worker.index], timeout=limit)
            results.append((worker.index, self.on_failure(worker.item, failure)))
        return results

    @staticmethod
    def _started(worker: _Worker) -> bool:
        """Whether the worker's message is that it started its item (its clock now set)."""
        if worker.started is not None or not worker.process.is_alive():
            return False
        try:
            if worker.conn.poll() and worker.conn.recv() == _STARTED:
                worker.started = time.monotonic()
                return True
        except Exception:  # EOF, or a message cut short by a death: the sentinel reports it
            return False
        return False

    @staticmethod
    def _receive(worker: _Worker) -> tuple[str, Any] | None:
        """The worker's answer, or None when it died without one; an answer that came whole
        but does not unpickle here (an exception whose ``__init__`` takes other arguments
        than its ``args``) is raised as an error, not charged as a death."""
        try:
            while worker.conn.poll():
                message: tuple[str, Any] | str = worker.conn.recv()
                if not isinstance(message, str):
                    return message
        except (EOFError, OSError):  # EOF, or a message cut short by the death
            return None
        except Exception as exc:  # read whole (the length came first), but not unpickled
            error = f"a worker's answer cannot be read: {type(exc).__name__}: {exc}"
            return _RAISED, RuntimeError(error)
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
        """Done, failed or interrupted: stop every worker at once; items not taken stay not
        run."""
        for worker in self.running + self.idle:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in self.running + self.idle:
            self._discard(worker, timeout=2.0)
        self.running.clear()
        self.idle.clear()
