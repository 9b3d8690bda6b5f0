"""vLLM 0.33's Triton gather kernel for small CPU->GPU pages (kvsim issue 12, fault 3).

Two halves. The choice of path (:class:`real.copy_path.KernelLoadCopy`, the rule of
:mod:`kvsim.engine.copy_paths`) and every fallback run without Triton, with a stand-in
kernel that copies pages with torch. The kernel itself (tests marked ``triton``) runs under
Triton's CPU interpreter, on CPU tensors through their raw addresses, exactly the code
compiled on a GPU; CI installs Triton and sets ``KVSIM_REQUIRE_TRITON=1`` so that those
tests cannot skip there.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kvsim.core.errors import InputError
from kvsim.engine.copy_paths import (
    KERNEL_MAX_PAGE_BYTES,
    KERNEL_MIN_DESCRIPTORS,
    load_uses_kernel,
)
from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob
from real import check_copies, check_goals, copy_path, host_pool, triton_load
from real.calibrate import H2D, Point, calibrate, fit
from real.copy_path import KernelLoadCopy, TorchCopy, default_copy_path
from real.device import Device
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.transfer import RealTransferBackend
from real.triton_load import MAX_PROGRAMS, split_pages, tile_words

REQUIRE_TRITON = os.environ.get("KVSIM_REQUIRE_TRITON") == "1"
KERNEL = "triton-gather"


class TorchPages:
    """A stand-in for the gather kernel: the same ``copy_pages`` contract, done with torch;
    it records which tiles were prepared before any launch used them."""

    name = KERNEL

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (pages, tile)
        self.tiles: set[int] = set()
        self.unprepared: list[int] = []

    def prepare(self, tile, device):
        self.tiles.add(tile)

    def copy_pages(self, dst, src, pages, *, tile):
        self.calls.append((len(pages), tile))
        if tile not in self.tiles:
            self.unprepared.append(tile)
        for d, s, w in pages.tolist():
            dst[d : d + w].copy_(src[s : s + w])


STREAM = Device("cpu").compute_stream  # eager: a path's enqueued copies run at once


def interpreted_kernel() -> triton_load.GatherKernel:
    """The real kernel under Triton's interpreter: skip without Triton, except under
    ``KVSIM_REQUIRE_TRITON=1`` (CI), where a missing Triton fails the test."""
    try:
        importlib.import_module("triton")
    except ImportError as exc:
        if REQUIRE_TRITON:
            pytest.fail(f"KVSIM_REQUIRE_TRITON=1 but triton cannot be imported: {exc}")
        pytest.skip(f"triton is not importable ({exc})")
    return triton_load.GatherKernel(interpret=True)


def host_source(dst: torch.Tensor, src: torch.Tensor, host: torch.Tensor) -> bool:
    """``is_load`` on CPU tensors: the job reads the host pool."""
    return src.data_ptr() == host.data_ptr()


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("n", [1, KERNEL_MIN_DESCRIPTORS - 1, KERNEL_MIN_DESCRIPTORS, 37])
@pytest.mark.parametrize(
    "page_bytes", [8, 2048, 16 * 1024, KERNEL_MAX_PAGE_BYTES - 8, KERNEL_MAX_PAGE_BYTES, 65536]
)
def test_loads_take_the_kernel_exactly_where_vllm_would(page_bytes, n, pinned):
    words = page_bytes // 8
    src = torch.arange(n * words, dtype=torch.int64)
    dst = torch.zeros(n * words, dtype=torch.int64)
    kernel = TorchPages()
    path = KernelLoadCopy(
        TorchCopy(), kernel, is_load=lambda d, s: s is src, pinned=lambda t: pinned
    )
    runs = [(i * words, (n - 1 - i) * words, words) for i in range(n)]
    want = load_uses_kernel(page_bytes, n, pinned=pinned)
    assert path.route(dst, src, runs, None) == (KERNEL if want else "copy_")
    path.copy(dst, src, runs, stream=STREAM, stable_source=True)
    assert path.jobs == {KERNEL: int(want), "copy_": int(not want)}
    assert torch.equal(dst, src.view(n, words).flip(0).reshape(-1))
    # the other direction never goes through the kernel
    assert path.route(src, dst, runs, None) == "copy_"


def test_pages_not_in_whole_words_never_take_the_kernel():
    """A page of 2052 bytes is under 28 KiB but not 8-byte words: DMA, as in vLLM."""
    src = torch.arange(20 * 2052, dtype=torch.int32).to(torch.uint8)
    dst = torch.zeros_like(src)
    path = KernelLoadCopy(
        TorchCopy(), TorchPages(), is_load=lambda d, s: True, pinned=lambda t: True
    )
    runs = [(i * 2052, i * 2052, 2052) for i in range(20)]
    assert path.route(dst, src, runs, None) == "copy_"
    aligned = [(i * 2048, i * 2048, 2048) for i in range(20)]  # uint8, but whole words
    assert path.route(dst, src, aligned, None) == KERNEL


def test_forced_modes():
    src = torch.arange(4 * 8192, dtype=torch.int64)
    dst = torch.zeros_like(src)
    runs = [(i * 8192, i * 8192, 8192) for i in range(4)]  # 4 pages of 64 KiB: DMA by rule
    kw = dict(is_load=lambda d, s: True, pinned=lambda t: True)
    assert KernelLoadCopy(TorchCopy(), TorchPages(), **kw).route(dst, src, runs, None) == "copy_"
    forced = KernelLoadCopy(TorchCopy(), TorchPages(), mode="kernel", **kw)
    assert forced.route(dst, src, runs, None) == KERNEL
    small = [(i * 8, i * 8, 8) for i in range(40)]
    never = KernelLoadCopy(TorchCopy(), TorchPages(), mode="dma", **kw)
    assert never.route(dst, src, small, None) == "copy_"
    unpinned = KernelLoadCopy(TorchCopy(), TorchPages(), mode="kernel", is_load=kw["is_load"])
    assert unpinned.route(dst, src, runs, None) == "copy_"  # CPU tensors are not pinned
    with pytest.raises(ValueError, match="load path"):
        KernelLoadCopy(TorchCopy(), TorchPages(), mode="fast")


def test_split_pages_restores_the_descriptors_coalescing_merged():
    runs = [(0, 100, 6), (20, 0, 2), (40, 50, 5)]
    got = split_pages(runs, 2).tolist()
    assert got == [
        [0, 100, 2],
        [2, 102, 2],
        [4, 104, 2],
        [20, 0, 2],
        [40, 50, 2],
        [42, 52, 2],
        [44, 54, 1],  # not a whole number of pages: a shorter last one
    ]
    assert split_pages(runs, None).tolist() == [list(r) for r in runs]
    assert split_pages([], 4).shape == (0, 3)


def test_tiles_follow_vllm():
    """next_pow2(largest page), at most 8 KiB, in 8-byte words."""
    assert tile_words(8) == 1
    assert tile_words(24) == 4
    assert tile_words(2048) == 256
    assert tile_words(16 * 1024) == 1024
    assert tile_words(20 * 1024) == 1024


# --------------------------------------------------------------------------- choosing


def _cuda_stub():
    return SimpleNamespace(is_cuda=True, torch_device=torch.device("cuda", 0))


def _fake_batch(monkeypatch):
    batch = copy_path.BatchCopy(lambda *a: 0, handle_of=lambda s: 0)
    monkeypatch.setattr(copy_path, "resolve_batch_copy", lambda: (batch, "resolved"))
    return batch


def test_without_triton_cuda_loads_stay_on_dma(monkeypatch):
    batch = _fake_batch(monkeypatch)
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    monkeypatch.setattr(triton_load, "_resolved", {})
    kernel, why = triton_load.resolve_gather_kernel(_cuda_stub())
    assert kernel is None and "triton not importable" in why
    assert default_copy_path(_cuda_stub(), load="auto") is batch


def test_a_failing_probe_keeps_dma(monkeypatch):
    """A Triton that imports but cannot compile or launch (no C compiler, no unified
    addressing) must not take over the loads."""

    class Broken:
        def __init__(self, **kw):
            raise RuntimeError("no C compiler")

    live: dict[int, int] = {}
    monkeypatch.setattr(host_pool, "cuda_register", live.__setitem__)
    monkeypatch.setattr(host_pool, "cuda_unregister", live.pop)
    monkeypatch.setattr(triton_load, "import_triton", lambda: (object(), "importable"))
    monkeypatch.setattr(triton_load, "GatherKernel", Broken)
    monkeypatch.setattr(triton_load, "_resolved", {})
    monkeypatch.setattr(triton_load.torch.version, "hip", None)
    kernel, why = triton_load.resolve_gather_kernel(Device("cpu"))
    assert kernel is None and why == "not a CUDA device"
    kernel, why = triton_load._probe(Device("cpu"))
    assert kernel is None and "probe failed (RuntimeError: no C compiler)" in why
    assert live == {}  # the probe's pool is released


def test_a_refused_pin_keeps_dma_and_says_why(monkeypatch):
    """The kernel reads page-locked memory only: no pinning, no kernel."""

    def refuse(ptr, n):
        raise RuntimeError("cudaHostRegister failed (injected)")

    monkeypatch.setattr(host_pool, "cuda_register", refuse)
    monkeypatch.setattr(triton_load, "import_triton", lambda: (object(), "importable"))
    monkeypatch.setattr(triton_load.torch.version, "hip", None)
    kernel, why = triton_load._probe(Device("cpu"))
    assert kernel is None and "pinning refused" in why and "injected" in why


@pytest.mark.triton
def test_the_probe_reads_registered_memory_with_the_tile_jobs_use(monkeypatch):
    """The probe copies pages under, at and over one 8 KiB tile (the tile of every page
    over 4 KiB) out of a pool registered as the host pool is, then keeps that tile."""
    kernel = interpreted_kernel()
    live: dict[int, int] = {}
    monkeypatch.setattr(host_pool, "cuda_register", live.__setitem__)
    monkeypatch.setattr(host_pool, "cuda_unregister", live.pop)
    registered: list[bool] = []
    real_copy = kernel.copy_pages

    def spy(dst, src, pages, *, tile):
        registered.append(host_pool.host_pinned(src))
        real_copy(dst, src, pages, tile=tile)

    kernel.copy_pages = spy
    got, why = triton_load.probe_copy(Device("cpu"), lambda: kernel)
    assert got is kernel and "exact" in why, why
    assert registered == [True] and tile_words(16 * 1024) == triton_load.PROBE_TILE
    assert kernel.tiles == {triton_load.PROBE_TILE} and live == {}


def test_cuda_with_the_kernel_wraps_dma_unless_told_otherwise(monkeypatch):
    batch = _fake_batch(monkeypatch)
    kernel = TorchPages()
    monkeypatch.setattr(triton_load, "resolve_gather_kernel", lambda d: (kernel, "ok"))
    path = default_copy_path(_cuda_stub())
    assert isinstance(path, KernelLoadCopy) and path.dma is batch and path.kernel is kernel
    assert path.mode == "auto" and path.name == f"cuMemcpyBatchAsync+{KERNEL}"
    assert default_copy_path(_cuda_stub(), load="dma") is batch
    assert default_copy_path(_cuda_stub(), load="kernel").mode == "kernel"
    assert isinstance(default_copy_path(_cuda_stub(), prefer="copy_"), TorchCopy)
    monkeypatch.setenv("KVSIM_LOAD_PATH", "dma")
    assert default_copy_path(_cuda_stub()) is batch
    monkeypatch.setenv("KVSIM_LOAD_PATH", "fastest")
    with pytest.raises(InputError, match="KVSIM_LOAD_PATH"):
        default_copy_path(_cuda_stub())


@pytest.mark.parametrize("kind", ["eager", "deferred"])
def test_a_cpu_device_never_looks_for_triton(kind, monkeypatch):
    def boom(device):
        raise AssertionError("resolved the gather kernel on a CPU device")

    monkeypatch.setattr(triton_load, "resolve_gather_kernel", boom)
    monkeypatch.setenv("KVSIM_LOAD_PATH", "kernel")
    assert isinstance(Device("cpu", mode=kind).copy_path(), TorchCopy)


# --------------------------------------------------------------------------- the backend


SMALL = KVGeometry(4, 2048)


def _backend(kind, layout, kernel, geom=SMALL, units=1, pinned=True):
    dev = Device("cpu", mode=kind)
    gpu = GpuKVCache(geom, 32, layout, dev.torch_device)
    host = HostPool(HostLayout(geom, units, layout), 32)
    path = KernelLoadCopy(
        TorchCopy(),
        kernel,
        is_load=lambda d, s: host_source(d, s, host.data),
        pinned=lambda t: pinned,
    )
    return gpu, path, RealTransferBackend(dev, gpu, host, copy_path=path)


def _store_then_load(gpu, be, blocks, chunks, keys, into):
    be.submit(TransferJob(1, STORE, blocks, chunks, 0, len(blocks), keys), 0.0)
    be.drain()
    gpu.data.zero_()  # a load that copied nothing cannot pass
    be.submit(TransferJob(2, LOAD, into, chunks, 0, len(into), keys), 0.0)
    be.drain()
    assert [r.success for r in be.records] == [True, True], [r.error for r in be.records]
    assert be.integrity.checked_blocks == len(into) and be.integrity.mismatched_bytes == 0


@pytest.mark.parametrize("kind", ["eager", "deferred"])
@pytest.mark.parametrize(
    "layout,blocks,want",
    [
        (LAYER_MAJOR, 4, KERNEL),  # 4 blocks x 4 layers = 16 pages of 2 KiB
        (LAYER_MAJOR, 3, "copy_"),  # 12 pages: too few for a launch
        (BLOCK_FIRST, 16, KERNEL),  # cross-layer: one 8 KiB page per block
        (BLOCK_FIRST, 4, "copy_"),
    ],
)
def test_backend_loads_route_by_vllms_descriptors(kind, layout, blocks, want):
    kernel = TorchPages()
    gpu, path, be = _backend(kind, layout, kernel)
    chunks = list(range(7, 7 + blocks))
    keys = [f"k{c}" for c in chunks]
    into = list(range(31, 31 - blocks, -1))
    _store_then_load(gpu, be, list(range(blocks)), chunks, keys, into)
    assert path.jobs == {KERNEL: int(want == KERNEL), "copy_": 1 + int(want != KERNEL)}
    for b, k in zip(into, keys):
        assert torch.equal(gpu.block_view(b), gpu.expected((k, 0)))
    page = 2048 if layout == LAYER_MAJOR else 8192
    assert kernel.tiles == {tile_words(page)}  # compiled when the backend started
    if want == KERNEL:
        assert kernel.calls == [(be.records[1].descriptors * 2048 // page, tile_words(page))]
        assert kernel.unprepared == []  # no job launched a tile nobody had compiled


@pytest.mark.parametrize("kind", ["eager", "deferred"])
def test_merged_runs_are_counted_as_the_pages_vllm_copies(kind):
    """Two sub-blocks of a chunk land in consecutive GPU blocks, so the backend merges each
    pair of 16 KiB pages into a 32 KiB run, over vLLM's threshold: the decision must be on
    the 16 KiB pages (vLLM never merges), and the kernel copies 16 of them."""
    kernel = TorchPages()
    gpu, path, be = _backend(kind, LAYER_MAJOR, kernel, KVGeometry(2, 16 * 1024), units=2)
    chunks, keys = [3, 9, 5, 12], ["a", "b", "c", "d"]
    _store_then_load(gpu, be, list(range(8)), chunks, keys, list(range(16, 24)))
    load = be.records[1]
    assert load.descriptors == 16 and load.copies == 8  # merged pairwise
    assert kernel.calls == [(16, 1024)] and path.jobs[KERNEL] == 1


@pytest.mark.parametrize("kind", ["eager", "deferred", "threaded"])
@pytest.mark.parametrize("pin", [True, False])
def test_loads_from_a_registered_pool_take_the_kernel_on_every_stand_in(kind, pin):
    """Issue 29, fault 1, end to end: with the copy path's own pinned predicate (no test
    override), a small-page load from the pool goes through the kernel exactly when the
    pool registered its memory. (``Tensor.is_pinned()`` on the old pool's view said no.)"""
    live: dict[int, int] = {}
    dev = Device("cpu", mode=kind)
    gpu = GpuKVCache(SMALL, 32, LAYER_MAJOR, dev)
    host = HostPool(
        HostLayout(SMALL, 1, LAYER_MAJOR),
        32,
        pin=pin,
        register=live.__setitem__,
        unregister=live.pop,
    )
    kernel = TorchPages()
    path = KernelLoadCopy(TorchCopy(), kernel, is_load=lambda d, s: s is host.data)
    be = RealTransferBackend(dev, gpu, host, copy_path=path)
    _store_then_load(gpu, be, [0, 1, 2, 3], [4, 9, 6, 7], list("abcd"), [20, 21, 22, 23])
    assert path.jobs == {KERNEL: int(pin), "copy_": 2 - int(pin)}
    host.close()
    assert live == {}


def test_a_dma_only_path_compiles_nothing():
    kernel = TorchPages()
    path = KernelLoadCopy(TorchCopy(), kernel, mode="dma")
    path.prepare(2048, torch.device("cpu"))
    assert kernel.tiles == set()
    KernelLoadCopy(TorchCopy(), kernel, mode="kernel").prepare(64 * 1024, torch.device("cpu"))
    assert kernel.tiles == {tile_words(8192)}  # forced: any page size, at most 8 KiB tiles


@pytest.mark.parametrize("kind", ["eager", "deferred"])
def test_unpinned_host_memory_loads_through_dma(kind):
    kernel = TorchPages()
    gpu, path, be = _backend(kind, LAYER_MAJOR, kernel, pinned=False)
    _store_then_load(gpu, be, [0, 1, 2, 3], [4, 5, 6, 7], list("wxyz"), [20, 21, 22, 23])
    assert kernel.calls == [] and path.jobs == {KERNEL: 0, "copy_": 2}


# --------------------------------------------------------------------------- calibration


def test_calibration_times_the_kernel_where_a_load_would_use_it():
    dev = Device("cpu", mode="threaded")
    live: dict[int, int] = {}
    path = KernelLoadCopy(
        TorchCopy(),
        TorchPages(),
        is_load=lambda d, s: any(p <= s.data_ptr() < p + n for p, n in live.items()),
        pinned=lambda t: True,
    )
    _params, fitted = calibrate(
        dev,
        copy_path=path,
        sizes=(4096, 64 * 1024),
        counts=(1, 16),
        max_bytes=1 << 20,
        repeats=1,
        pin=True,
        register=lambda p, n: live.__setitem__(p, n),
        unregister=live.pop,
    )
    kernel_points = sorted(map(tuple, fitted["point_paths"][KERNEL]))
    # loads of 4 KiB pages are also timed at 64 and 256 copies, for the kernel fit
    assert kernel_points == [("both", 4096, 16), *(("h2d", 4096, n) for n in (16, 64, 256))]
    assert len(fitted["point_paths"]["copy_"]) == 12 - 2
    assert path.jobs[KERNEL] == 4 * 2  # 4 points x (warm-up + 1 repeat)
    assert fitted["copy_path"] == f"copy_+{KERNEL}"
    assert _params.h2d.kernel is not None and _params.h2d.kernel.curve[0][0] == 4096


# --------------------------------------------------------------------------- gpu_check


def _small_pages(device, **kw):
    sizes = dict(page_sizes=(16 * 1024,), layers=8, blocks=16, jobs=2, blocks_per_job=4)
    return check_copies.small_page_loads(device, **{**sizes, **kw})


def test_gpu_check_small_pages_without_the_kernel_fails_its_goal():
    res = _small_pages(Device("cpu", mode="eager"))
    [row] = res["pages"]
    assert "kernel" not in row and res["kernel_status"] == "not a CUDA device"
    assert row["auto"] == "kernel"  # 32 pages of 16 KiB: vLLM's rule would launch it
    dma = row["dma"]
    assert dma["mismatched_bytes"] == 0 and dma["checked_blocks"] == 2 * 4 and dma["gbps"] > 0
    goal = check_goals.small_page_goal(res)
    assert not goal["passed"] and "kernel not available (not a CUDA device)" in goal["detail"]
    bad = {**res, "pages": [{**row, "dma": {**dma, "mismatched_bytes": 8}}]}
    assert "8 mismatched bytes" in check_goals.small_page_goal(bad)["detail"]
    assert not check_goals.small_page_goal({"error": "x"})["passed"]


# --------------------------------------------------------------------------- the kernel


def _pages_with_gaps(rng, sizes):
    """Destination pages in random order with 1-3 sentinel words between them, sources
    scattered elsewhere: ``(pages [n, 3], dst words, src words)``."""
    order = list(range(len(sizes)))
    rng.shuffle(order)
    dst_at, at = {}, rng.randint(1, 3)
    for i in order:
        dst_at[i] = at
        at += sizes[i] + rng.randint(1, 3)
    src_order = list(range(len(sizes)))
    rng.shuffle(src_order)
    src_at, s = {}, 0
    for i in src_order:
        src_at[i] = s
        s += sizes[i] + rng.randint(0, 2)
    pages = np.array([(dst_at[i], src_at[i], w) for i, w in enumerate(sizes)], dtype=np.int64)
    return pages, at + 2, s


@pytest.mark.triton
@pytest.mark.parametrize(
    "n,sizes,tile",
    [
        (1, "small", None),
        (5, "small", None),  # fewer pages than programs
        (MAX_PROGRAMS, "small", None),
        (MAX_PROGRAMS + 1, "mixed", None),  # one program takes two
        (37, "mixed", None),  # not a multiple of the grid
        (9, "mixed", 4),  # pages of several tiles, the last partial
        (7, "large", None),  # 20 KiB pages: 3 tiles of 8 KiB
    ],
)
def test_kernel_copies_exactly_the_pages(n, sizes, tile):
    kernel = interpreted_kernel()
    rng = random.Random(n * 31 + (tile or 0))
    if sizes == "small":
        words = [rng.choice([1, 2, 3, 5, 8]) for _ in range(n)]
    elif sizes == "large":
        words = [20 * 1024 // 8] * n
    else:
        words = [rng.randint(1, 40) for _ in range(n)]
    pages, dst_words, src_words = _pages_with_gaps(rng, words)
    src = torch.randint(0, 2**62, (src_words,), dtype=torch.int64)
    src_before = src.clone()
    dst = torch.full((dst_words,), -7, dtype=torch.int64)
    want = dst.clone()
    for d, s, w in pages.tolist():
        want[d : d + w] = src[s : s + w]
    tile = tile or tile_words(max(words) * 8)
    kernel.copy_pages(dst, src, pages, tile=tile)
    assert torch.equal(dst, want)  # the pages, and not one word around them
    assert torch.equal(src, src_before)
    assert kernel.launches == 1


@pytest.mark.triton
def test_kernel_on_int8_views_of_the_same_bytes():
    """Offsets in bytes (uint8 tensors, whole 8-byte words) address the same memory."""
    kernel = interpreted_kernel()
    src = torch.arange(64, dtype=torch.int64)
    dst = torch.zeros(64, dtype=torch.int64)
    pages = np.array([(8 * 8, 40 * 8, 16), (0, 0, 24)], dtype=np.int64)  # bytes
    kernel.copy_pages(dst.view(torch.uint8), src.view(torch.uint8), pages, tile=4)
    want = torch.zeros(64, dtype=torch.int64)
    want[8:10], want[0:3] = src[40:42], src[0:3]
    assert torch.equal(dst, want)
    with pytest.raises(ValueError, match="8-byte words"):
        kernel.copy_pages(dst.view(torch.uint8), src.view(torch.uint8), pages + 4, tile=4)


@pytest.mark.triton
@pytest.mark.parametrize("kind", ["eager", "deferred"])
@pytest.mark.parametrize("layout", [LAYER_MAJOR, BLOCK_FIRST])
def test_backend_loads_through_the_interpreted_kernel_are_byte_exact(kind, layout):
    kernel = interpreted_kernel()
    gpu, path, be = _backend(kind, layout, kernel)
    blocks = 16
    chunks = random.Random(1).sample(range(32), blocks)
    keys = [f"c{c}" for c in chunks]
    into = random.Random(2).sample(range(32), blocks)
    _store_then_load(gpu, be, list(range(blocks)), chunks, keys, into)
    assert path.jobs == {KERNEL: 1, "copy_": 1} and kernel.launches == 1
    assert kernel.unprepared_launches == 0  # its tile was compiled when the backend started
    for b, k in zip(into, keys):
        assert torch.equal(gpu.block_view(b), gpu.expected((k, 0)))


@pytest.mark.triton
def test_gpu_check_small_pages_with_the_interpreted_kernel_passes(monkeypatch):
    """The section's own code with the real kernel forced on: on CPU tensors a load is a
    job whose source is the section's host pool (on CUDA: host to device)."""
    kernel = interpreted_kernel()
    dev = Device("cpu", mode="eager")
    pools: list[HostPool] = []
    make_pool, real_paths = check_copies.host_pool, check_copies.load_paths

    def remembered_pool(*args, **kwargs):
        pools.append(make_pool(*args, **kwargs))
        return pools[-1]

    def with_kernel(device):
        dma = real_paths(device)[0]["dma"]
        load = KernelLoadCopy(
            dma,
            kernel,
            mode="kernel",
            is_load=lambda d, s: host_source(d, s, pools[-1].data),
            pinned=lambda t: True,
        )
        return {"kernel": load, "dma": dma}, "interpreted"

    monkeypatch.setattr(check_copies, "host_pool", remembered_pool)
    monkeypatch.setattr(check_copies, "load_paths", with_kernel)
    res = _small_pages(dev, page_sizes=(16 * 1024, 32 * 1024))
    for row in res["pages"]:  # 32 KiB pages too: forced, whatever vLLM's rule says
        assert row["kernel"]["jobs_by_path"] == {KERNEL: 2, "copy_": 0}
        assert row["kernel"]["unprepared_launches"] == 0  # compiled when the backend started
        assert row["dma"]["jobs_by_path"] == {"copy_": 2}
        for name in ("kernel", "dma"):
            assert row[name]["mismatched_bytes"] == 0 and row[name]["checked_blocks"] == 8
    assert [r["auto"] for r in res["pages"]] == ["kernel", "dma"]
    goal = check_goals.small_page_goal(res)
    assert goal["passed"], goal
    assert "kernel/DMA x" in goal["detail"]


def test_kernel_points_stay_out_of_the_dma_curve():
    """A load timed through the kernel is another path: the copy-engine fit ignores it and
    the report keeps it apart."""
    dma = [Point(H2D, s, n, 1e-5 + n * s / 10e9, "copy_") for s in (4096, 65536) for n in (1, 8)]
    slow = Point(H2D, 4096, 64, 1.0, KERNEL)
    with_kernel, without = fit([*dma, slow])["directions"][H2D], fit(dma)["directions"][H2D]
    assert with_kernel["curve_gbps"] == without["curve_gbps"]
    assert with_kernel["overhead_s"] == without["overhead_s"]
    assert with_kernel["kernel_points"] == [[4096, 64, 1.0]] and without["kernel_points"] == []
