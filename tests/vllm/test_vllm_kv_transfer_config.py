"""What vLLM 0.33 does with a ``kv_transfer_config`` that names no connector (``kv_connector:
null`` or missing) but sizes a CPU tier in ``kv_connector_extra_config``, driven on CPU:
``KVTransferConfig`` and ``VllmConfig`` take it (it is no KV transfer instance), but the
scheduler builds a connector from every ``kv_transfer_config`` and refuses to start. So a
measurements file holding one is refused as it is read (:meth:`VllmArgs.connector`), not
run with offloading nor without. Skipped without vLLM (failed under
``KVSIM_REQUIRE_VLLM=1``)."""

from __future__ import annotations

import pytest
from measurements_small import experiment, write
from support import need_vllm

need_vllm("vllm.v1.core.sched.scheduler")

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from kvsim.accuracy.measurements import read_measurements  # noqa: E402
from kvsim.core.errors import InputError  # noqa: E402
from kvsim.integrations.vllm_engine_setup import (  # noqa: E402
    build_vllm_config,
    kv_cache_config,
    quiet_vllm,
)

pytestmark = pytest.mark.vllm

BLOCK, PAGE = 16, 64
#: a CPU tier vLLM's CPUOffloadingSpec can hold: a whole number of page-aligned chunk rows
EXTRA = {"cpu_bytes_to_use": 64 * 4096}


def vllm_scheduler(transfer: dict[str, object]) -> Scheduler:
    """vLLM 0.33's scheduler started (as its engine core starts it) with ``transfer`` as
    ``--kv-transfer-config``; vLLM's own error where it refuses."""
    with quiet_vllm():
        config = build_vllm_config(
            max_model_len=1024,
            gpu_block_tokens=BLOCK,
            chunk_tokens=BLOCK,
            cpu_chunks=None,
            page_bytes=PAGE,
            policy="lru",
            store_threshold=0,
            max_num_batched_tokens=2048,
            max_num_seqs=8,
            long_prefill_token_threshold=0,
            async_scheduling=False,
        )
        config.kv_transfer_config = KVTransferConfig(**transfer)  # type: ignore[arg-type]
        kv = kv_cache_config(100, BLOCK, PAGE)
        config.cache_config.num_gpu_blocks = kv.num_blocks  # as the engine core sets it
        return Scheduler(
            vllm_config=config,
            kv_cache_config=kv,
            structured_output_manager=StructuredOutputManager(config),
            block_size=BLOCK,
            hash_block_size=BLOCK,
            log_stats=False,
        )


@pytest.mark.parametrize(
    "transfer",
    [
        {"kv_connector": None, "kv_connector_extra_config": EXTRA},
        {"kv_role": "kv_both", "kv_connector_extra_config": EXTRA},
    ],
    ids=["null", "missing"],
)
def test_vllm_refuses_to_start_and_so_does_kvsims_reader(transfer, tmp_path):
    assert not KVTransferConfig(**transfer).is_kv_transfer_instance  # the config is taken
    with pytest.raises(ValueError, match="Connector name is not set in KVTransferConfig"):
        vllm_scheduler(transfer)
    vllm = {**experiment()["vllm"], "kv_transfer_config": transfer}
    path = write(tmp_path / "m.yaml", experiment(vllm=vllm))
    with pytest.raises(InputError, match=r"kv_transfer_config\.kv_connector: vLLM 0.33 does not"):
        read_measurements(path)


def test_vllm_starts_with_the_connector_named_and_kvsim_reads_it(tmp_path):
    transfer = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": EXTRA,
    }
    assert type(vllm_scheduler(transfer).connector).__name__ == "OffloadingConnector"
    vllm = {**experiment()["vllm"], "kv_transfer_config": transfer}
    exp = read_measurements(write(tmp_path / "m.yaml", experiment(vllm=vllm))).experiments[0]
    connector = exp.vllm.connector()
    assert connector is not None
    assert connector.kv_connector_extra_config.cpu_bytes_to_use == EXTRA["cpu_bytes_to_use"]
