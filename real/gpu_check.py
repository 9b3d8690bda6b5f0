"""One-shot device check: ``python -m real.gpu_check [--out DIR]``.

Prints one compact report (and writes it as JSON when ``--out`` is given):

1. the copy bandwidth curve (H2D, D2H, both at once; 4 KiB to 64 MiB), checked against
   the H200 goals (>= 45 GB/s one way for copies >= 2 MiB, >= 75 GB/s both ways);
2. integrity under concurrent compute: the real backend stores and loads blocks while
   sleep kernels occupy the compute stream; every loaded byte is checked (0 mismatches);
3. a small validation run (simulated vs real, the bundled Bailian sample) with the
   calibrated profile, whose median transfer-time error should be under 10 %.

On CUDA the sizes fit one H200 in well under 5 minutes; on CPU the same code runs with
small sizes (used by the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import TYPE_CHECKING, Any

from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob
from real.calibrate import BOTH, D2H, H2D, KIB, MIB, calibrate, gbps_at_least
from real.device import Device
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.transfer import RealTransferBackend

if TYPE_CHECKING:
    from kvsim.engine.transfer_model import TransferModelParams

GOAL_ONE_WAY_GBPS = 45.0
GOAL_BOTH_GBPS = 75.0
GOAL_MEDIAN_ERR = 0.10


def integrity_under_compute(
    device: Device,
    layout: str,
    *,
    geometry: KVGeometry,
    gpu_blocks: int,
    chunks: int,
    rounds: int,
    blocks_per_job: int,
    compute_s: float,
    seed: int = 0,
) -> dict[str, Any]:
    """Stores and loads through :class:`RealTransferBackend` while compute runs."""
    rng = random.Random(seed)
    gpu = GpuKVCache(geometry, gpu_blocks, layout, device.torch_device)
    host = HostPool(HostLayout(geometry, 1, layout), chunks, pin=device.is_cuda)
    try:
        backend = RealTransferBackend(device, gpu, host)
        stored: dict[int, str] = {}  # chunk -> key
        job_id = 0
        t0 = device.clock()
        half = gpu_blocks // 2
        for r in range(rounds):
            device.sleep(device.compute_stream, compute_s)  # a forward pass
            # store fresh blocks (lower half of the GPU cache) into random chunks
            src = rng.sample(range(half), blocks_per_job)
            dst_chunks = rng.sample(range(chunks), blocks_per_job)
            keys = [f"r{r}b{i}" for i in range(blocks_per_job)]
            job_id += 1
            backend.submit(
                TransferJob(
                    job_id,
                    STORE,
                    src,
                    dst_chunks,
                    blocks_per_job * geometry.block_bytes,
                    blocks_per_job,
                    keys,
                ),
                device.clock(),
            )
            for c, k in zip(dst_chunks, keys):
                stored[c] = k
            # load chunks stored earlier into the upper half
            ready = [c for c in stored if r > 0]
            if ready:
                picks = rng.sample(ready, min(blocks_per_job, len(ready)))
                dst = rng.sample(range(half, gpu_blocks), len(picks))
                job_id += 1
                backend.submit(
                    TransferJob(
                        job_id,
                        LOAD,
                        dst,
                        picks,
                        len(picks) * geometry.block_bytes,
                        len(picks),
                        [stored[c] for c in picks],
                    ),
                    device.clock(),
                )
            backend.order_compute_after_loads()
            backend.poll(device.clock())
            # keep at most a few jobs in flight so chunks are reused only after their copies
            if backend.in_flight > 4:
                backend.drain()
        backend.drain()
        elapsed = device.clock() - t0
        by_dir: dict[str, dict[str, Any]] = {}
        for d in (STORE, LOAD):
            recs = [x for x in backend.records if x.direction == d]
            busy = sum(x.duration for x in recs)
            nbytes = sum(x.nbytes for x in recs)
            by_dir[d] = {"jobs": len(recs), "gbps": nbytes / busy / 1e9 if busy > 0 else None}
        return {
            "layout": layout,
            "pinned": host.pinned,
            "rounds": rounds,
            "elapsed_s": elapsed,
            **backend.integrity.as_dict(),
            "directions": by_dir,
        }
    finally:
        host.close()


def run_check(
    device: Device, *, small: bool, validation_trace: str | None = None, out_dir: str | None = None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    report: dict[str, Any] = {"device": device.kind}
    if device.is_cuda:
        import torch

        report["gpu"] = torch.cuda.get_device_name(device.torch_device)
    cal_kwargs: dict[str, Any]
    integ: dict[str, Any]
    if small:
        cal_kwargs = dict(
            sizes=(4 * KIB, 64 * KIB, 2 * MIB), counts=(1, 4), max_bytes=8 * MIB, repeats=1
        )
        geometry = KVGeometry(4, 2048)
        integ = dict(gpu_blocks=32, chunks=48, rounds=6, blocks_per_job=4, compute_s=0.001)
    else:
        cal_kwargs = dict(max_bytes=512 * MIB, repeats=5)
        geometry = KVGeometry(32, 64 * KIB)  # llama-3.1-8b, 16-token block: 2 MiB
        integ = dict(gpu_blocks=512, chunks=2048, rounds=60, blocks_per_job=32, compute_s=0.02)
    params, fitted = calibrate(device, **cal_kwargs)
    report["pinned"] = fitted["pinned"]
    report["curve_gbps"] = {d: fitted["directions"][d]["effective_gbps"] for d in (H2D, D2H, BOTH)}
    one_way = {d: gbps_at_least(fitted, d, 2 * MIB) for d in (H2D, D2H)}
    both = gbps_at_least(fitted, BOTH, 2 * MIB)
    report["goals"] = {
        "h2d_gbps_ge_2MiB": one_way[H2D],
        "d2h_gbps_ge_2MiB": one_way[D2H],
        "both_gbps_ge_2MiB": both,
        "one_way_ok": all(v is not None and v >= GOAL_ONE_WAY_GBPS for v in one_way.values()),
        "both_ok": both is not None and both >= GOAL_BOTH_GBPS,
    }
    report["profile"] = params.to_dict()
    report["integrity"] = [
        integrity_under_compute(device, lay, geometry=geometry, **integ)
        for lay in (BLOCK_FIRST, LAYER_MAJOR)
    ]
    report["validation"] = _validation(device, params, small, validation_trace)
    report["wall_s"] = time.perf_counter() - t0
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "gpu_check.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=str)
        with open(os.path.join(out_dir, "profile.json"), "w", encoding="utf-8") as f:
            f.write(params.to_json())
    return report


def _validation(
    device: Device, params: TransferModelParams, small: bool, trace: str | None
) -> dict[str, Any]:
    from real.validate import ValidationSpec, default_trace, run_validation

    trace = trace or default_trace()
    spec = ValidationSpec.small_for_tests() if small else ValidationSpec.for_gpu_check()
    rep = run_validation(trace, spec, device=device, params=params)
    return rep.summary()


def format_report(rep: dict[str, Any]) -> str:
    lines = [
        f"kvsim gpu_check on {rep.get('gpu', rep['device'])} (pinned={rep['pinned']}, "
        f"{rep['wall_s']:.1f} s)",
        "bandwidth GB/s by copy size:",
    ]
    curves = rep["curve_gbps"]
    sizes = sorted({int(s) for c in curves.values() for s in c})
    lines.append("  size      " + "".join(f"{d:>9}" for d in curves))
    for s in sizes:
        label = f"{s // MIB} MiB" if s >= MIB else f"{s // KIB} KiB"
        vals = "".join(f"{curves[d].get(str(s), float('nan')):9.2f}" for d in curves)
        lines.append(f"  {label:<10}{vals}")
    g = rep["goals"]
    lines.append(
        f"goals: one-way >= {GOAL_ONE_WAY_GBPS} GB/s for >= 2 MiB: "
        f"{'PASS' if g['one_way_ok'] else 'FAIL'} (h2d {_fmt(g['h2d_gbps_ge_2MiB'])}, "
        f"d2h {_fmt(g['d2h_gbps_ge_2MiB'])}); both >= {GOAL_BOTH_GBPS}: "
        f"{'PASS' if g['both_ok'] else 'FAIL'} ({_fmt(g['both_gbps_ge_2MiB'])})"
    )
    for it in rep["integrity"]:
        dirs = ", ".join(
            f"{d} {v['jobs']} jobs {v['gbps'] or 0:.1f} GB/s" for d, v in it["directions"].items()
        )
        lines.append(
            f"integrity [{it['layout']}]: {it['checked_blocks']} blocks checked, "
            f"{it['mismatched_blocks']} mismatched ({it['mismatched_bytes']} bytes); {dirs}"
        )
    v = rep["validation"]
    err = v["job_err_median_pct"]
    lines.append(
        f"validation goal: median job-time error < {GOAL_MEDIAN_ERR:.0%}: "
        f"{'PASS' if err is not None and err < GOAL_MEDIAN_ERR * 100 else 'FAIL'} ({_fmt(err)} %)"
    )
    lines.append("validation: " + ", ".join(f"{k}={_fmt(val)}" for k, val in v.items()))
    return "\n".join(lines)


def _fmt(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="small sizes (default on CPU)")
    ap.add_argument("--trace", default=None, help="trace for the validation run")
    ap.add_argument("--out", default=None, help="folder for gpu_check.json and profile.json")
    args = ap.parse_args(argv)
    device = Device.auto()
    rep = run_check(
        device,
        small=args.small or not device.is_cuda,
        validation_trace=args.trace,
        out_dir=args.out,
    )
    print(format_report(rep))
    ok = all(it["mismatched_blocks"] == 0 for it in rep["integrity"])
    ok = ok and rep["validation"].get("integrity_mismatched_blocks", 1) == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
