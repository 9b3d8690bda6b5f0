"""kvsim policies inside vLLM's own CPUOffloadingManager make kvsim's decisions."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT, SYNTHETIC, need_vllm

from kvsim.api import make_options
from kvsim.cachemode import CacheReplay
from kvsim.traces import as_trace


def test_importing_the_module_does_not_import_vllm():
    code = (
        "import sys, kvsim, kvsim.integrations.vllm as v; "
        "assert 'vllm' not in sys.modules; assert 'KvsimS3FIFO' in dir(v); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    import kvsim.integrations.vllm as v

    with pytest.raises(AttributeError):
        v.NotExported  # noqa: B018


@pytest.mark.vllm
@pytest.mark.parametrize(
    "policy, class_name",
    [
        ("s3fifo", "KvsimS3FIFO"),
        ("sieve", "KvsimSieve"),
        ("arc-textbook", "KvsimARCTextbook"),
        ("wtinylfu", "KvsimWTinyLFU"),
        ("lfu", "KvsimLFU"),
        ("lru", "KvsimLRU"),
    ],
)
def test_vllm_manager_with_exported_policy_matches_kvsim(policy, class_name):
    need_vllm("vllm.v1.kv_offload.cpu.manager")
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

    import kvsim.integrations.vllm as integration
    from kvsim.integrations.from_vllm import VllmManagerDriver

    cls = getattr(integration, class_name)
    assert issubclass(cls, CachePolicy) and cls.__name__ == class_name
    tr = as_trace(SYNTHETIC, limit=250)
    config = make_options(cpu_chunks=900, policy=policy).resolve(tr.block_tokens)
    ours: list[tuple] = []
    CacheReplay(config).run(tr, ours.append)
    driver = VllmManagerDriver(900, "lru")
    driver.inner = CPUOffloadingManager(
        num_chunks=900, cache_policy=class_name, cache_policy_module_path="kvsim.integrations.vllm"
    )
    assert type(driver.inner._policy).__name__ == class_name
    theirs: list[tuple] = []
    summary = CacheReplay(config, manager=driver).run(tr, theirs.append)
    assert summary["chunks_evicted"] > 0
    assert theirs == ours


@pytest.mark.vllm
def test_belady_cannot_be_exported():
    need_vllm("vllm.v1.kv_offload.cpu.policies.base")
    from kvsim.integrations.vllm import vllm_policy_class

    with pytest.raises(ValueError, match="future"):
        vllm_policy_class("belady")


def test_position_view_answers_what_kvsim_policies_ask():
    # vLLM builds without a private positions dict still work through the public lookup
    from kvsim.core.context import RequestContext
    from kvsim.integrations.vllm import _PositionView
    from kvsim.policies import Chunk, LRUPolicy

    class FakeReqContext:
        def __init__(self, positions):
            self._p = positions

        def get_offload_key_position(self, key):
            return self._p.get(key)

    view = _PositionView(FakeReqContext({1: 16, 2: 32}))
    assert view.keys() >= {1, 2} and not (view.keys() >= {1, 3})
    assert view[2] == 32 and view.get(3) is None and 1 in view
    policy = LRUPolicy(4)
    ctx = RequestContext("r", view)  # type: ignore[arg-type]
    policy.insert_many([1, 2], [Chunk(0, 0), Chunk(1, 0)], ctx)
    assert policy.eviction_order() == [2, 1]  # a running request's tail is older than its head
