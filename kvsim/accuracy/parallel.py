"""A measurements file's experiments run on worker processes, one experiment a worker at a
time. Each experiment is a function of its inputs and seed, so the results are the same,
row for row, whatever the number of workers; they come back in the file's order.

Why processes: a suite of 25 experiments is minutes of CPU in one Python thread, and a fit
runs the file up to 150 times; experiments share nothing, so N cores take about 1/N of it.
The workers are :func:`kvsim.core.worker_pool.run_tasks`'s: a worker that dies (the OOM
killer, a signal) fails the experiment it was running, and only that one, with no retry.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvsim.accuracy.run import ExperimentResult, module_of, run_experiment
from kvsim.core.worker_pool import Failure, run_tasks

if TYPE_CHECKING:
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
    done = run_tasks(
        _run_one,
        (base_dir, settings),
        chosen,
        workers=min(workers, len(chosen)),
        on_failure=_died,
        in_order=True,
        name="kvsim-accuracy-worker",
    )
    for result, said in done:
        for text, category, filename, lineno, module in said:
            warnings.warn_explicit(text, category, filename, lineno, module)
        in_order.append(result)
        if progress is not None:
            progress(1)
    return in_order


def _died(exp: Experiment, failure: Failure) -> _Done:
    """The result of an experiment whose worker died (the OOM killer, a signal): a failure
    of that experiment alone, with how it died; the other experiments run on."""
    return ExperimentResult(exp.id, error=f"the process running it died ({failure.how})"), []


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
