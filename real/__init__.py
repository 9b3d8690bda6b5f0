"""The real backend: the same engine, manager and policies over real memory and copies.

* :mod:`real.device`: CUDA streams and events, or CPU tensors with emulated events;
* :mod:`real.kv_cache`: the paged GPU KV cache (layer-major or block-first), key patterns;
* :mod:`real.host_pool`: the pinned host region sized by vLLM's arithmetic;
* :mod:`real.transfer`: :class:`RealTransferBackend` (submit / poll / wait);
* :mod:`real.calibrate`: the copy-curve measurement that feeds the simulator's model;
* :mod:`real.validate`: simulated vs real run of one trace, and the comparison report;
* :mod:`real.gpu_check`: the one-shot device check script.

Everything runs on CPU tensors when CUDA is not available.
"""

from real.device import Device, cuda_available
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.transfer import RealTransferBackend

__all__ = [
    "BLOCK_FIRST",
    "LAYER_MAJOR",
    "Device",
    "GpuKVCache",
    "HostLayout",
    "HostPool",
    "KVGeometry",
    "RealTransferBackend",
    "cuda_available",
]
