"""Releasing host and device memory only once no copy can still be using it.

After an exception the streams may still hold copies into the host pool or the GPU cache.
Unregistering or freeing that memory then lets a DMA write into memory that was handed
back (or fault). So the device is drained first; if even that fails (a CUDA error), the
memory is kept for the life of the process instead.
"""

from __future__ import annotations

from real.device import Device
from real.host_pool import HostPool, keep_forever


def release_when_idle(device: Device, pool: HostPool, *also: object) -> None:
    """Wait for every stream of ``device``, then unpin ``pool``; on failure keep both
    ``pool`` and ``also`` (GPU tensors, backends) alive and re-raise."""
    try:
        device.run_pending()
    except BaseException:
        pool.leak()
        keep_forever(*also)
        raise
    pool.close()
