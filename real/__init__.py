"""The real backend: the same engine, manager and policies over real memory and copies.

* :mod:`real.device`: CUDA streams and events, or CPU stand-ins (eager, deferred: out of
  order across streams, threaded: asynchronous);
* :mod:`real.sleep_clock`: spin cycles per second of emulated GPU compute, kept measured;
* :mod:`real.kv_cache`: the paged GPU KV cache (layer-major or block-first), key patterns;
* :mod:`real.cuda_rt`: ``cudaHostRegister`` that leaves no pending CUDA error;
* :mod:`real.host_pool`: the page-aligned pinned host region sized by vLLM's arithmetic;
* :mod:`real.staging`: one host staging ring for a backend's small arrays;
* :mod:`real.lifetime`: memory released only once the device is idle;
* :mod:`real.copy_path`: ``copy_`` per run, one ``cuMemcpyBatchAsync`` per job, the kernel;
* :mod:`real.transfer`: :class:`RealTransferBackend` (submit / poll / wait);
* :mod:`real.compute`: the emulated forward pass on the compute stream;
* :mod:`real.machine`: CPU-only defaults sized to the machine's free memory;
* :mod:`real.calibrate`: the copy-curve measurement that feeds the simulator's model;
* :mod:`real.validate`: simulated vs real run of one trace (:mod:`real.validation_report`,
  :mod:`real.compare`, :mod:`real.job_noise`, :mod:`real.trace_slice`);
* :mod:`real.gpu_check`: the one-shot device check script (:mod:`real.check_env`,
  :mod:`real.check_copies`, :mod:`real.check_goals`).

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
