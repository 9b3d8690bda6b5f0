"""vLLM's two caches: the GPU block pool with its prefix cache (`gpu_cache`) and
the CPU offloading manager with its policies (`offload`)."""
