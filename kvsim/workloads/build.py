"""A workload and a load made into what the timed engine runs: a trace when the sends are
fixed before the run, an arrival source when they come out of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.numeric import is_whole
from kvsim.traces.model import Request, Trace
from kvsim.workloads.prompts import make_prompts
from kvsim.workloads.source import ClientSource
from kvsim.workloads.spec import Load, WorkloadSpec, load_load, load_workload
from kvsim.workloads.timing import plan_stages

__all__ = ["Workload", "build_workload"]


@dataclass(frozen=True)
class Workload:
    """A benchmark run's requests, ready for the engine.

    ``source()`` makes a fresh :class:`ClientSource` (one per run: it keeps the run's
    state); ``closed`` says whether arrivals depend on the run (a concurrency load, or
    inference-perf's stages that wait for a drain); if not, ``trace()`` is the same
    requests as a :class:`Trace` with fixed arrival times and ``stages()`` their stages.
    """

    spec: WorkloadSpec
    load: Load
    seed: int
    block_tokens: int

    @property
    def closed(self) -> bool:
        return self.load.closed

    @property
    def num_stages(self) -> int:
        return len(self.load.stages)

    def source(self) -> ClientSource:
        """A new client for one run."""
        return ClientSource(
            plan_stages(self.load, self.seed),
            make_prompts(self.spec, self.seed, self.block_tokens),
            drain=self.load.timing == "inference-perf",
            gap_s=self.load.stage_gap_s,
        )

    @property
    def num_requests(self) -> int | None:
        """Requests the run sends, where the load fixes it (else None)."""
        return self.source().total

    def _open_requests(self) -> tuple[list[Request], list[int]]:
        if self.closed:
            raise InputError(
                f"a {self.load.type} load ({self.load.timing} timing, "
                f"{len(self.load.stages)} stage(s)) has no fixed arrival times: they come "
                "out of the run: simulate it (kvsim simulate --workload W --load L)"
            )
        src = self.source()
        out: list[Request] = []
        while True:
            nxt = src.next_arrival(out[-1].arrival_s if out else 0.0)
            if nxt is None:
                break
            req = nxt[1]
            if req is not None:
                out.append(req)
        return out, src.stage_of

    def trace(self) -> Trace:
        """The requests with their fixed arrival times (an open load only)."""
        reqs, _ = self._open_requests()
        return Trace.from_requests(reqs, self.block_tokens, name=self.name)

    def stages(self) -> list[int]:
        """Each request's stage (index = request id; an open load only)."""
        return self._open_requests()[1]

    @property
    def name(self) -> str:
        """A short label: ``shared_prefix(10x10, 100+447->248) constant x2``."""
        s = self.spec
        what = (
            f"shared_prefix({s.num_groups}x{s.num_prompts_per_group}, "
            f"{s.system_prompt_len}+{s.question_len}->{s.output_len})"
            if s.type == "shared_prefix"
            else f"random({s.prefix_len}+{s.input_len}->{s.output_len}, r={s.range_ratio})"
        )
        return f"{what} {self.load.type} x{len(self.load.stages)}"

    def describe(self) -> dict[str, Any]:
        """What a run's metadata records."""
        return {
            "workload": self.spec.as_dict(),
            "load": self.load.as_dict(),
            "seed": self.seed,
            "block_tokens": self.block_tokens,
        }


def build_workload(workload: Any, load: Any, seed: int = 0, block_size: int = 16) -> Workload:
    """``workload`` (a :class:`SharedPrefixWorkload` / :class:`RandomWorkload` or its dict)
    under ``load`` (a :class:`Load` or its dict), seeded, in ``block_size``-token blocks
    (vLLM's ``--block-size``: the prefix cache's unit).

    Args:
        workload: what each request sends.
        load: when requests are sent (rate or concurrency stages).
        seed: the workload's lengths and order and the load's timing all follow from it.
        block_size: tokens per block id.

    Returns:
        a :class:`Workload`; a bad block or value is a one-line :class:`InputError`.
    """
    if type(block_size) is not int or block_size <= 0:
        raise InputError(f"block_size must be a positive integer, got {block_size!r}")
    if not is_whole(seed) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    w = Workload(load_workload(workload), load_load(load), int(seed), block_size)
    if w.num_requests == 0:  # nothing to run, or to write as a trace
        raise InputError(
            f"the {w.load.type} load sends no request in its {w.num_stages} stage(s) (a stage "
            "at rate R for D seconds sends R x D requests, rounded down)"
        )
    return w
