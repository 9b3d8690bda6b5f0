"""A measurements file's experiments run on worker processes, one experiment a worker at a
time. Each experiment is a function of its inputs and seed, so the results are the same,
row for row, whatever the number of workers; they come back in the file's order.

Why processes: a suite of 25 experiments is minutes of CPU in one Python thread, and a fit
runs the file up to 150 times; experiments share nothing, so N cores take about 1/N of it.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from kvsim.accuracy.run import ExperimentResult, module_of, run_experiment
from kvsim.core.processes import become_worker, driver_pid, how_it_died

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from kvsim.accuracy.measurements import Experiment

#: a warning a worker raised, as its driver raises it again: (text, category, file, line,
#: module: the name filters match, :func:`module_of`)
_Said = tuple[str, type[Warning], str, int, str | None]
#: a worker's answer: an experiment's result and the warnings it raised
_Done = tuple[ExperimentResult, list[_Said]]


def run_experiments(
    chosen: Sequence[Experiment],
    base_dir: str,
    settings: dict[str, Any],
    workers: int,
    progress: Callable[[int], None] | None = None,
) -> list[ExperimentResult]:
    """Each experiment of ``chosen`` run by :func:`run_experiment` with ``settings``, in order.

    Args:
        chosen: the experiments.
        base_dir: the measurements file's folder (paths in it are relative to it).
        settings: :func:`run_experiment`'s keywords (profile, stage cap, seed, loop, warm-up).
        workers: processes to run them on; 1 (or a single experiment) runs them here.
        progress: called with 1 as each result comes back, in order.

    Returns:
        The results in ``chosen``'s order; the warnings a worker raised are raised here, as
        they would have been in this process, when its result comes back."""
    if workers <= 1 or len(chosen) <= 1:
        results = []
        for exp in chosen:
            results.append(run_experiment(exp, base_dir, **settings))
            if progress is not None:
                progress(1)
        return results
    in_order = []
    for result, said in _Workers(min(workers, len(chosen)), base_dir, settings).run(chosen):
        for text, category, filename, lineno, module in said:
            warnings.warn_explicit(text, category, filename, lineno, module)
        in_order.append(result)
        if progress is not None:
            progress(1)
    return in_order


class _Workers:
    """Worker processes with a pipe each, one experiment a worker at a time: a worker that
    dies (the OOM killer, a signal) fails the experiment it was running, and only that one,
    and another takes its place (``multiprocessing.Pool`` lost such a task and waited for it
    forever, or wedged on the queue lock the dead worker held)."""

    def __init__(self, size: int, base_dir: str, settings: dict[str, Any]) -> None:
        self.context = multiprocessing.get_context()
        self.size = size
        self.args = (base_dir, settings, driver_pid(self.context))

    def run(self, chosen: Sequence[Experiment]) -> Iterator[_Done]:
        """Each experiment's result and warnings, in ``chosen``'s order."""
        todo = deque(enumerate(chosen))
        running: dict[Connection, tuple[BaseProcess, int]] = {}
        idle: list[tuple[Connection, BaseProcess]] = []
        finished: dict[int, _Done] = {}
        following = 0
        try:
            while following < len(chosen):
                while todo and len(running) < self.size:
                    index, exp = todo.popleft()
                    conn, process = idle.pop() if idle else self._spawn()
                    conn.send((index, exp))
                    running[conn] = (process, index)
                handles: list[Connection | int] = [*running]
                handles += [process.sentinel for process, _ in running.values()]
                ready = set(wait(handles))
                for conn in [c for c in running if c in ready or running[c][0].sentinel in ready]:
                    process, index = running.pop(conn)
                    outcome, alive = self._outcome(conn, process, chosen[index].id)
                    finished[index] = outcome
                    if alive:
                        idle.append((conn, process))
                    else:
                        self._stop(conn, process)
                while following in finished:
                    yield finished.pop(following)
                    following += 1
        finally:  # an error or Ctrl-C here: no worker goes on with an experiment nobody reads
            for conn, process in [*idle, *((c, p) for c, (p, _) in running.items())]:
                self._stop(conn, process)

    def _spawn(self) -> tuple[Connection, BaseProcess]:
        ours, theirs = self.context.Pipe()
        process = self.context.Process(
            target=_worker_main, args=(theirs, *self.args), name="kvsim-accuracy-worker"
        )
        process.daemon = True
        process.start()
        theirs.close()
        return ours, process

    @staticmethod
    def _outcome(conn: Connection, process: BaseProcess, experiment: str) -> tuple[_Done, bool]:
        """The worker's answer and whether it can take another; a failed result when it
        died without one; a worker's exception raised here."""
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            conn.close()
            process.join()
            error = f"the process running it died ({how_it_died(process.exitcode)})"
            return (ExperimentResult(experiment, error=error), []), False
        if kind == "raised":
            raise value
        return value, process.is_alive()  # one that died after answering takes no more

    @staticmethod
    def _stop(conn: Connection, process: BaseProcess) -> None:
        conn.close()
        if process.is_alive():
            process.kill()
        process.join()


def _worker_main(
    conn: Connection, base_dir: str, settings: dict[str, Any], parent_pid: int | None
) -> None:
    """A worker: one experiment in, its result (or the exception it raised) out."""
    become_worker(parent_pid)
    while True:
        try:
            _, exp = conn.recv()
        except (EOFError, OSError):  # the driver is done with it
            return
        try:
            answer: tuple[str, Any] = ("done", _run_one(exp, base_dir, settings))
        except Exception as exc:
            answer = ("raised", exc)
        try:
            conn.send(answer)
        except OSError:  # the driver is gone
            return
        except Exception as exc:  # an exception that does not pickle
            conn.send(("raised", RuntimeError(f"{type(exc).__name__}: {exc}")))


def _run_one(
    exp: Experiment, base_dir: str, settings: dict[str, Any]
) -> tuple[ExperimentResult, list[_Said]]:
    """In a worker: one experiment's result and the warnings it raised, for the driver."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_experiment(exp, base_dir, **settings)
    return result, [
        (str(w.message), w.category, w.filename, w.lineno, module_of(w.filename)) for w in caught
    ]
