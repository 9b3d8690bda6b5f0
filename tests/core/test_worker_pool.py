"""kvsim/core/worker_pool.py, the one pool behind a sweep's local executor and an accuracy
run's workers: results in order or as they finish, a worker's death charged to its task alone
(re-run or failed, as the caller chooses), a per-task timeout, items taken lazily, and the
same under spawn as under fork."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvsim.core.worker_pool import Failure, run_tasks


def square_after(x: int, delay_per_unit: float) -> int:
    """x * x after ``x * delay_per_unit`` seconds (a larger item finishes later)."""
    time.sleep(x * delay_per_unit)
    return x * x


def dies_on(x: int, victim: int, once_flag: str | None) -> int:
    """x, except that the worker running ``victim`` is SIGKILLed: every time, or (with
    ``once_flag``, a file path) only the first time."""
    if x != victim:
        return x
    if once_flag is not None:
        try:
            os.close(os.open(once_flag, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return x
    os.kill(os.getpid(), signal.SIGKILL)
    return x


def sleeps_on(x: int, victim: int) -> int:
    """x, except that ``victim`` blocks far longer than any test waits."""
    if x == victim:
        time.sleep(60)
    return x


def raises_on(x: int, victim: int) -> int:
    if x == victim:
        raise ValueError(f"bad item {x}")
    return x


class _TwoArgs(Exception):
    """An exception that pickles but does not unpickle (its args are not its __init__'s)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


def raises_unpicklable_on(x: int, victim: int) -> int:
    if x == victim:
        raise _TwoArgs(x, x)
    return x


def failed(x: int, failure: Failure) -> str:
    if failure.timeout is not None:
        return f"{x} timed out after {failure.timeout:g} s ({failure.how})"
    return f"{x} died ({failure.how}), {failure.deaths} times"


def test_results_in_order_or_as_they_finish() -> None:
    # finishes 0.75 s apart: far more than a worker's start-up, even on a loaded machine
    items = [2, 0, 1]
    in_order = run_tasks(square_after, (0.75,), items, workers=3, on_failure=failed, in_order=True)
    assert list(in_order) == [4, 0, 1]
    as_done = run_tasks(square_after, (0.75,), items, workers=3, on_failure=failed)
    assert list(as_done) == [0, 1, 4]


def test_a_killed_worker_fails_its_task_alone_with_no_retry() -> None:
    results = run_tasks(dies_on, (2, None), range(5), workers=2, on_failure=failed, in_order=True)
    assert list(results) == [0, 1, "2 died (killed by SIGKILL), 1 times", 3, 4]


def test_a_task_killed_fewer_times_than_the_limit_runs_again(tmp_path: Path) -> None:
    flag = str(tmp_path / "died-once")
    results = run_tasks(
        dies_on, (2, flag), range(5), workers=2, on_failure=failed, deaths_to_fail=2
    )
    assert sorted(results) == [0, 1, 2, 3, 4]
    assert os.path.exists(flag)  # it did die once


def test_a_task_that_always_kills_its_worker_fails_at_the_limit() -> None:
    results = run_tasks(
        dies_on, (1, None), range(3), workers=2, on_failure=failed, deaths_to_fail=2
    )
    assert sorted(map(str, results)) == ["0", "1 died (killed by SIGKILL), 2 times", "2"]


def test_a_task_past_its_timeout_is_killed_and_failed() -> None:
    start = time.monotonic()
    results = run_tasks(
        sleeps_on, (1,), range(4), workers=2, on_failure=failed, in_order=True, timeout=0.5
    )
    assert list(results) == [0, "1 timed out after 0.5 s (killed by SIGKILL)", 2, 3]
    assert time.monotonic() - start < 10


def test_a_task_that_raises_raises_in_the_driver() -> None:
    with pytest.raises(ValueError, match="bad item 1"):
        list(run_tasks(raises_on, (1,), range(3), workers=2, on_failure=failed))


def test_an_answer_that_does_not_unpickle_raises_and_is_no_death() -> None:
    # it was charged as its worker's death: the live worker waited for, then SIGKILLed
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="answer cannot be read: TypeError"):
        list(run_tasks(raises_unpicklable_on, (1,), range(3), workers=2, on_failure=failed))
    assert time.monotonic() - start < 4


def own_pid(x: int) -> int:
    return os.getpid()


def _children() -> set[int]:
    """The pids of this process's live workers (reaping the dead, as the pool would)."""
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


def test_a_worker_that_died_idle_is_not_handed_the_next_item() -> None:
    # its death was charged to the next item, which it never ran: with one death to fail,
    # that item failed
    results = run_tasks(own_pid, (), range(2), workers=1, on_failure=failed, in_order=True)
    first = next(results)  # its worker is idle now, until the generator goes on
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and first in _children():
        time.sleep(0.05)
    second = next(results)
    assert isinstance(second, int) and second != first
    assert list(results) == []


def test_items_are_taken_only_as_workers_free_up() -> None:
    taken: list[int] = []

    def items() -> Iterator[int]:
        for i in range(6):
            taken.append(i)
            yield i

    results = run_tasks(square_after, (0.0,), items(), workers=2, on_failure=failed)
    first = next(results)
    assert first in (0, 1) and len(taken) <= 3  # two running, at most one more handed on
    assert sorted([first, *results]) == [i * i for i in range(6)]
    assert taken == list(range(6))


def test_closing_early_stops_every_worker() -> None:
    results = run_tasks(sleeps_on, (1,), range(3), workers=2, on_failure=failed)
    assert next(results) in (0, 2)
    before = {p.pid for p in multiprocessing.active_children()}
    results.close()
    assert not before & {p.pid for p in multiprocessing.active_children()}


@pytest.mark.skipif("spawn" not in multiprocessing.get_all_start_methods(), reason="no spawn")
def test_the_pool_works_under_spawn() -> None:
    spawn = multiprocessing.get_context("spawn")
    results = run_tasks(
        dies_on, (1, None), range(3), workers=2, on_failure=failed, in_order=True, context=spawn
    )
    assert list(results) == [0, "1 died (killed by SIGKILL), 1 times", 2]
