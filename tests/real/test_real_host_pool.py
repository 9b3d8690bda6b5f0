"""Host pool sizing and pinning: exact size, <= 64 GiB pieces, no leak on any error path."""

from __future__ import annotations

import pytest

from kvsim.specs.models import get_model
from kvsim.specs.sizing import size_for_model
from real import host_pool
from real.host_pool import HostLayout, HostPool, PinError
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, KVGeometry


class FakeRegistrar:
    """Records registrations; fails on the ``fail_at``-th call."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.live: dict[int, int] = {}
        self.calls = 0

    def register(self, ptr: int, nbytes: int) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError("cudaHostRegister: out of memory (injected)")
        assert ptr not in self.live
        self.live[ptr] = nbytes

    def unregister(self, ptr: int) -> None:
        del self.live[ptr]


def test_rows_match_vllm_sizing_arithmetic():
    spec = get_model("llama-3.1-8b")
    sizing = size_for_model(spec, 1 << 30, gpu_block_tokens=16, blocks_per_chunk=1)
    g = KVGeometry.from_model(spec, 16)
    layout = HostLayout(g, 1, LAYER_MAJOR)
    assert layout.raw_chunk_bytes == sizing.raw_chunk_bytes
    assert layout.row_bytes == sizing.row_bytes
    odd = HostLayout(KVGeometry(3, 40), 5, BLOCK_FIRST)  # 600 raw bytes -> one 4096-byte row
    pool = HostPool(odd, 7)
    assert pool.nbytes == 7 * 4096 and pool.data.numel() * 8 == pool.nbytes  # no rounding up
    assert not pool.pinned


def test_pinning_in_row_aligned_pieces_and_release():
    reg = FakeRegistrar()
    layout = HostLayout(KVGeometry(2, 2048), 1)  # 4096-byte rows
    pool = HostPool(
        layout,
        10,
        pin=True,
        max_piece_bytes=3 * 4096 + 100,
        register=reg.register,
        unregister=reg.unregister,
    )
    assert pool.pinned and pool.num_pieces == 4
    assert sorted(reg.live.values()) == [4096, 3 * 4096, 3 * 4096, 3 * 4096]
    assert all(size % layout.row_bytes == 0 for size in reg.live.values())
    pool.close()
    assert reg.live == {} and not pool.pinned


@pytest.mark.parametrize("require", [False, True])
def test_failure_mid_registration_unregisters_what_was_done(require):
    reg = FakeRegistrar(fail_at=3)
    layout = HostLayout(KVGeometry(2, 2048), 1)
    kwargs = dict(
        pin=True,
        require_pin=require,
        max_piece_bytes=2 * 4096,
        register=reg.register,
        unregister=reg.unregister,
    )
    if require:
        with pytest.raises(PinError, match="injected"):
            HostPool(layout, 10, **kwargs)
    else:
        pool = HostPool(layout, 10, **kwargs)
        assert not pool.pinned and "injected" in pool.pin_error
        pool.data.fill_(1)  # still usable, pageable
    assert reg.calls == 3 and reg.live == {}


def test_interrupt_mid_registration_still_releases():
    reg = FakeRegistrar()

    def register(ptr, n):
        if reg.calls == 2:
            raise KeyboardInterrupt
        reg.register(ptr, n)

    with pytest.raises(KeyboardInterrupt):
        HostPool(
            HostLayout(KVGeometry(2, 2048), 1),
            10,
            pin=True,
            max_piece_bytes=4096,
            register=register,
            unregister=reg.unregister,
        )
    assert reg.live == {}


def test_pool_base_is_page_aligned():
    """Fault 7: ``torch.empty`` is only 64-byte aligned; the pool starts on a page."""
    for chunks in (1, 3, 17):
        pool = HostPool(HostLayout(KVGeometry(2, 2048), 1), chunks)
        assert pool.data.data_ptr() % 4096 == 0
        assert pool.data.numel() * 8 == pool.nbytes


class FakeCudart:
    """``torch.cuda.cudart()`` whose register fails, and a runtime that tracks its last error."""

    def __init__(self) -> None:
        self.last_error = 0

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.last_error = 1  # cudaErrorInvalidValue, left pending by the runtime
        return 1

    def cudaHostUnregister(self, ptr):
        return 0

    def cudaGetLastError(self):
        err, self.last_error = self.last_error, 0
        return err


def test_failed_cuda_register_leaves_no_pending_error(monkeypatch):
    """Fault 6: a failed cudaHostRegister leaves the runtime's last error set; torch's next
    kernel launch would raise it. It is cleared at once, as vLLM does."""
    import torch

    from real import cuda_rt

    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(cuda_rt, "_libcudart", lambda: fake)
    pool = HostPool(HostLayout(KVGeometry(2, 2048), 1), 4, pin=True)
    assert not pool.pinned and "cudaHostRegister" in pool.pin_error
    assert fake.last_error == 0
    with pytest.raises(PinError):
        HostPool(HostLayout(KVGeometry(2, 2048), 1), 4, pin=True, require_pin=True)
    assert fake.last_error == 0


def test_pool_storage_starts_on_the_page():
    """Issue 29, fault 1: torch answers ``is_pinned()`` for a tensor's storage base, not
    its data pointer. A page-aligned view into a larger ``torch.empty`` left the base 4 KiB
    short of the registered pages; the pool's storage itself must start on the page."""
    for chunks in (1, 3, 17):
        pool = HostPool(HostLayout(KVGeometry(2, 2048), 1), chunks)
        base = pool.data.untyped_storage().data_ptr()
        assert base == pool.data.data_ptr() and base % 4096 == 0


def test_the_copy_paths_pinned_predicate_agrees_with_the_pool():
    """The predicate the copy path routes loads by (its default, not a test's override)
    says what the pool says, for the whole pool and any view of it."""
    from types import SimpleNamespace

    import torch

    from real.copy_path import KernelLoadCopy, TorchCopy

    reg = FakeRegistrar()
    layout = HostLayout(KVGeometry(4, 2048), 2, LAYER_MAJOR)
    pinned = HostPool(
        layout,
        6,
        pin=True,
        max_piece_bytes=2 * 16384,
        register=reg.register,
        unregister=reg.unregister,
    )
    pageable = HostPool(layout, 6)
    assert pinned.num_pieces == 3  # the whole pool spans three registrations
    path = KernelLoadCopy(TorchCopy(), SimpleNamespace(name="kernel"))
    for pool in (pinned, pageable):
        views = [pool.data, pool.row(5), pool.block_view(2, 1), pool.data[7:99]]
        for view in views:
            assert path.pinned(view) == pool.holds_pinned(view) == pool.pinned
    assert not path.pinned(torch.empty(64, dtype=torch.int64))  # not the pool's memory
    # torch's own rule asks about the storage base: registered too, now that it is the pool's
    base = pinned.data.untyped_storage().data_ptr()
    assert host_pool.is_registered(base, 1)
    pinned.close()
    assert not path.pinned(pinned.data) and not pinned.holds_pinned(pinned.data)
