"""The GPU check's verdict: one line per goal, each naming what is copied and the published
figure it is held against, and the lines that only report (the environment, the clock, the
copy-size table).

A goal's status is PASS or FAIL, or SKIP where this run could not measure it by design (a
CPU device has no GPU tests to run); a section that crashed or ran out of time fails every
goal it feeds ("not measured"). Bandwidth goals are stated per copy, the unit the hardware
sees: a 2 MiB copy is a whole Llama-3.1-8B block in the block-first layout, a 64 KiB copy
one layer's page of it in vLLM's layer-major layout (32 copies per block).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

from real.check_copies import kernel_ran_every_job

KIB, MIB = 1 << 10, 1 << 20
GOAL_MEDIAN_ERR_PCT = 10.0
SMALL_PAGE = 16 * KIB  # the small-page goal's page: under vLLM's 28 KiB threshold

REFERENCES = {
    "pin": "vLLM #51080: ~0.1 s/GB (55 s for 512 GiB, 4xH200 NVL host); LightLLM #1527: ~0.18 s/GB",
    "h2d_2m": "vLLM blog 2026-01-08 (H100, PCIe Gen5): ~50 GB/s one way for large blocks; "
    "vLLM PR #42212: 51.4-51.8 GB/s H2D for >= 64 KiB copies",
    "d2h_2m": "vLLM blog 2026-01-08 (H100, PCIe Gen5): ~50 GB/s D2H for large blocks",
    "both_2m": "vLLM blog 2026-01-08 (H100): DMA 83.4 GB/s both ways at 2 MB blocks",
    "h2d_64k": "vLLM PR #42212 (H100, PCIe Gen5, one batched call): 38.8-51.8 GB/s at 64 KiB",
    "d2h_64k": "none published for D2H at 64 KiB; H2D's is 38.8-51.8 GB/s (vLLM PR #42212)",
    "small": "vLLM PR #42212 (H100): DMA 6.3-7.1 GB/s for 16 KiB copies, so vLLM sends loads "
    "of >= 16 pages under 28 KiB to its gather kernel",
    "integrity": "vLLM #45704: a store without its cross-stream wait corrupted blocks on "
    "every iteration",
    "self": "none published: calibration and the backend on one machine must agree (a "
    "self-consistency check, not a prediction)",
    "sim": "none published: kvsim's target for its simulator on a calibrated link",
    "tests": "kvsim's real-backend tests",
}

#: (key, goal, layout, copy bytes, direction, floor GB/s)
BANDWIDTH_GOALS = (
    (
        "h2d_2m",
        "H2D of 2 MiB copies (block-first: one copy per block)",
        "block_first",
        2 * MIB,
        "h2d",
        45.0,
    ),
    ("d2h_2m", "D2H of 2 MiB copies (block-first)", "block_first", 2 * MIB, "d2h", 45.0),
    (
        "both_2m",
        "both ways at once, 2 MiB copies (block-first), aggregate",
        "block_first",
        2 * MIB,
        "both",
        75.0,
    ),
    (
        "h2d_64k",
        "H2D of 64 KiB copies (layer-major: a 2 MiB block is 32 such pages)",
        "layer_major",
        64 * KIB,
        "h2d",
        39.0,
    ),
    ("d2h_64k", "D2H of 64 KiB copies (layer-major)", "layer_major", 64 * KIB, "d2h", 39.0),
)


def ok(section: Any) -> TypeGuard[Any]:
    """A section that ran (not missing, crashed or skipped for time)."""
    return section is not None and not (
        isinstance(section, dict) and ("error" in section or "skipped" in section)
    )


def _goal(key: str, goal: str, status: str | bool, detail: str) -> dict[str, Any]:
    if isinstance(status, bool):
        status = "PASS" if status else "FAIL"
    return {
        "key": key,
        "goal": goal,
        "status": status,
        "passed": status == "PASS",
        "detail": detail,
        "reference": REFERENCES[key],
    }


def _fmt(v: object, digits: int = 4) -> str:
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def pinning_goal(pin: Any) -> dict[str, Any]:
    goal = "page-locking host memory (cudaHostRegister)"
    if not ok(pin):
        return _goal("pin", goal, False, "not measured")
    if pin["works"] is None:
        return _goal("pin", goal, "SKIP", pin["why"])
    if not pin["works"]:
        return _goal(
            "pin",
            goal,
            False,
            f"refused ({pin['error']}): every figure below measures pageable, staged copies",
        )
    runs = ", ".join(
        f"{r['gib']:g} GiB: {r['register_s_per_gib']:.3f} s/GiB to register, "
        f"{r['unregister_s_per_gib']:.3f} to unregister"
        for r in pin["runs"]
    )
    return _goal("pin", goal, True, runs)


def bandwidth_goals(grid: Any) -> list[dict[str, Any]]:
    out = []
    for key, goal, layout, size, direction, floor in BANDWIDTH_GOALS:
        text = f"{goal} >= {floor:g} GB/s"
        row = (
            next((r for r in grid if r["layout"] == layout and r["copy_bytes"] == size), None)
            if ok(grid)
            else None
        )
        if row is None:
            out.append(_goal(key, text, False, "not measured"))
            continue
        gbps = row[direction]["gbps"]  # each burst moves its direction(s) only
        notes = [f"{_fmt(gbps)} GB/s", f"{row[direction]['copies_per_job']} copies per job"]
        if not row["pinned"]:
            notes.append("pageable memory")
        if not row[direction]["gate_held"]:
            notes.append("the host fell behind the copies: a lower bound")
        out.append(_goal(key, text, gbps is not None and gbps >= floor, ", ".join(notes)))
    return out


def small_page_goal(sp: Any) -> dict[str, Any]:
    """Byte-exact loads of 16 KiB pages with the kernel forced on and off; the forced run
    must have gone through the kernel for every job."""
    goal = f"loads of {SMALL_PAGE // KIB} KiB pages, gather kernel forced on and off: byte-exact"
    row = next((r for r in sp["pages"] if r["page_bytes"] == SMALL_PAGE), None) if ok(sp) else None
    if row is None:
        return _goal("small", goal, False, "not measured")
    dma, kernel = row["dma"], row.get("kernel")
    runs = [dma] if kernel is None else [kernel, dma]
    exact = all(
        r["mismatched_bytes"] == 0 and r["checked_blocks"] > 0 and not r["failed_jobs"]
        for r in runs
    )
    parts = [f"DMA ({dma['path']}) {_fmt(dma['gbps'])} GB/s"]
    if kernel is None:
        parts.insert(0, f"kernel not available ({sp['kernel_status']})")
        ran = False
    else:
        parts.insert(0, f"kernel {_fmt(kernel['gbps'])} GB/s")
        if kernel["gbps"] and dma["gbps"]:
            parts.append(f"kernel/DMA x{kernel['gbps'] / dma['gbps']:.2f}")
        ran = kernel_ran_every_job(kernel)
        if not ran:
            parts.append(f"the kernel copied {kernel['jobs_by_path']} of {kernel['jobs']} jobs")
    bad = sum(r["mismatched_bytes"] for r in runs)
    parts.append(
        f"{bad} mismatched bytes, {sum(r['checked_blocks'] for r in runs)} blocks "
        f"checked; vLLM's rule picks {row['auto']}"
    )
    return _goal("small", goal, exact and ran, ", ".join(parts))


def integrity_goal(integ: Any) -> dict[str, Any]:
    goal = "0 mismatched bytes under concurrent stores, loads and compute (both layouts)"
    if not ok(integ):
        return _goal("integrity", goal, False, "not measured")
    bad = sum(i["mismatched_bytes"] for i in integ)
    checked = sum(i["checked_blocks"] for i in integ)
    return _goal(
        "integrity",
        goal,
        bad == 0 and checked > 0,
        f"{bad} mismatched bytes, {checked} blocks checked",
    )


def validation_goals(v: Any) -> list[dict[str, Any]]:
    lim = f"< {GOAL_MEDIAN_ERR_PCT:g}%"
    self_goal = f"calibrate vs backend: median job-time error of the jobs replayed alone {lim}"
    sim_goal = f"simulator vs measured: median error of the simulated run's job times {lim}"
    ttft_goal = f"simulator vs measured: median TTFT error {lim}"
    if not ok(v):
        return [
            _goal("self", self_goal, False, "not measured"),
            _goal("sim", sim_goal, False, "not measured"),
            _goal("sim", ttft_goal, False, "not measured"),
        ]
    noise = f"noise {_fmt(v['job_noise_median_pct'], 3)}%"
    alone = v["job_err_alone_median_pct"]
    self_detail = (
        f"{_fmt(alone, 3)}% over {v['noise_jobs']} jobs alone ({noise}); in the run "
        f"{_fmt(v['job_err_median_pct'], 3)}% over {v['jobs_measured']} jobs "
        f"({v['store_jobs']} stores, {v['load_jobs']} loads), where they took "
        f"x{_fmt(v['jobs_in_run_over_alone'], 3)} their time alone"
    )
    matched = v["matched_err_median_pct"]
    sim_detail = (
        f"{_fmt(matched, 3)}% over {v['jobs_matched_to_sim']} jobs matched to the "
        f"simulated run ({noise})"
    )
    ttft = v["ttft_err_median_pct"]
    ttft_detail = (
        f"{_fmt(ttft, 3)}% over {v['requests']} requests: median simulated "
        f"{_fmt(v['ttft_predicted_median_s'])} s, measured "
        f"{_fmt(v['ttft_measured_median_s'])} s; hit decisions identical: "
        f"{v['hit_decisions_identical']} on the wall clock{_batching(v)}, "
        f"{v.get('lockstep_hit_decisions_identical')} in lockstep"
    )
    return [
        _goal("self", self_goal, alone is not None and alone < GOAL_MEDIAN_ERR_PCT, self_detail),
        _goal("sim", sim_goal, matched is not None and matched < GOAL_MEDIAN_ERR_PCT, sim_detail),
        _goal("sim", ttft_goal, ttft is not None and ttft < GOAL_MEDIAN_ERR_PCT, ttft_detail),
    ]


def _batching(v: dict[str, Any]) -> str:
    """Where the wall-clock run's steps first took other requests than the simulation's."""
    first = v.get("first_batching_difference")
    return "" if first is None else f" (its steps first differ at request {first})"


def tests_goal(t: Any) -> dict[str, Any]:
    goal = "real-backend tests on this device (pytest tests/real)"
    if not ok(t):
        return _goal("tests", goal, False, "not run")
    if t.get("ran") is False:
        return _goal("tests", goal, "SKIP", t["why"])
    return _goal("tests", goal, t["returncode"] == 0, t["summary"])


def evaluate_goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every goal, from the sections in ``data``; a goal whose section has an unexpected
    shape fails with the reason instead of taking the other goals (and the report) down."""
    parts: list[tuple[str, Callable[[Any], Any], str, int]] = [
        ("pin", pinning_goal, "pinning", 1),
        ("h2d_2m", bandwidth_goals, "bandwidth", len(BANDWIDTH_GOALS)),
        ("small", small_page_goal, "small_pages", 1),
        ("integrity", integrity_goal, "integrity", 1),
        ("sim", validation_goals, "validation", 3),
        ("tests", tests_goal, "tests", 1),
    ]
    out: list[dict[str, Any]] = []
    for key, fn, section, count in parts:
        try:
            got = fn(data.get(section))
        except Exception as exc:  # a section of an unexpected shape
            why = f"could not evaluate the {section} section ({type(exc).__name__}: {exc})"
            got = [_goal(key, f"{section} goal {i + 1}", False, why) for i in range(count)]
        out.extend(got if isinstance(got, list) else [got])
    return out


def format_goals(goals: Iterable[dict[str, Any]]) -> str:
    return "\n".join(
        f"{g['status']} {g['goal']}: {g['detail']} (reference: {g['reference']})" for g in goals
    )


def exit_status(data: dict[str, Any], sections: Iterable[str]) -> int:
    """1 when a section crashed or ran out of time, a byte mismatched, a test failed or the
    lockstep run's decisions or jobs differ from the simulation's."""
    if any(not ok(data.get(s)) for s in sections):
        return 1
    counts: list[int] = [i["mismatched_bytes"] for i in data.get("integrity") or []]
    for row in (data.get("small_pages") or {}).get("pages", []):
        counts += [row[k]["mismatched_bytes"] for k in ("kernel", "dma") if k in row]
    tests = data.get("tests") or {}
    failed = validation_failures(data.get("validation") or {})
    return 1 if any(counts) or tests.get("returncode", 0) or failed else 0


def validation_failures(v: dict[str, Any]) -> list[str]:
    """What fails a validation (its summary ``v``), as ``gpu_check`` and ``kvsim validate``
    judge it: a loaded byte that differs, or a lockstep run (:mod:`real.lockstep`) whose
    hit decisions or jobs are not the simulation's (unlike the wall-clock run's, a
    difference there is never the machine's load); none when the lockstep run did not
    run. The wall-clock run's decisions are reported only."""
    failed = [
        f"{key} {v[key]}"
        for key in ("integrity_mismatched_bytes", "lockstep_mismatched_bytes")
        if v.get(key)
    ]
    keys = ("lockstep_hit_decisions_identical", "lockstep_jobs_identical")
    if not all(v.get(k, True) for k in keys):
        failed.append("the lockstep run's hit decisions or jobs differ from the simulation's")
    return failed


def info_lines(data: dict[str, Any], say: Callable[[str], None]) -> None:
    """The lines that report without judging: the machine, the clock, the copy sizes."""
    env = data["environment"] if ok(data.get("environment")) else {}
    link = env.get("pcie_under_load") or {}
    if env and env["device"] != "cuda":
        say(
            f"INFO machine: CPU stand-in ({env['mode']}), {env['host_cpus']} x "
            f"{env['host_cpu']}, torch {env['torch']}; copy path {env['copy_path']}: every "
            "GB/s below is memcpy on this host, not a GPU's"
        )
    elif env:
        say(
            f"INFO machine: {env.get('gpu', env.get('device'))}, driver "
            f"{env.get('nvidia_driver')} (CUDA {env.get('cuda_driver_api')}), runtime "
            f"{env.get('cuda_runtime')}, torch {env.get('torch')}, triton {env.get('triton')}; "
            f"PCIe gen {link.get('current_gen')} x{link.get('current_width')} under load "
            f"(max gen {link.get('max_gen')} x{link.get('max_width')}), GPU NUMA node "
            f"{link.get('numa_node')}; copy path {env.get('copy_path')}; kernel: "
            f"{env.get('load_kernel')}"
        )
    timing = data.get("timing")
    if ok(timing) and "back_to_back_us" not in timing:
        say(f"INFO timing: {timing['clock']}, steps of {_fmt(timing['smallest_step_s'])} s")
    elif ok(timing):
        b2b = timing["back_to_back_us"]
        q = timing["absolute_quantum_us_at_age_s"]
        say(
            f"INFO timing: {timing['clock']}; back-to-back events {_fmt(b2b.get('median'))} us "
            f"(smallest {_fmt(b2b.get('min_nonzero'))}); absolute times lose "
            f"{_fmt(q['60.0'])} us a minute into a run, {_fmt(q['300.0'])} us five minutes in "
            "(durations are measured between their own events)"
        )
    grid = data.get("bandwidth")
    if ok(grid):
        say("INFO GB/s through backend jobs by copy size (d2h / h2d / both):")
        for r in grid:
            size = r["copy_bytes"]
            label = f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"
            say(
                f"INFO   {r['layout']:<12}{label:>8}: {_fmt(r['d2h']['gbps'], 3):>7} / "
                f"{_fmt(r['h2d']['gbps'], 3):>7} / {_fmt(r['both']['gbps'], 3):>7}"
                f"  ({r['h2d']['copies_per_job']} copies a job, loads via {r['load_paths']})"
            )
