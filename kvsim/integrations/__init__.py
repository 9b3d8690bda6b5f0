"""Bridges between kvsim and vLLM, one module per direction. Each imports vLLM lazily, so
importing kvsim never imports vLLM (or anything else heavy).

* :mod:`.vllm`: kvsim -> vLLM, kvsim policies as vLLM ``CachePolicy`` classes that a vLLM
  server loads (``cache_policy_module_path: kvsim.integrations.vllm``; the name is part of
  deployed configurations, so it stays);
* :mod:`.from_vllm`: vLLM -> kvsim, vLLM's own ``CPUOffloadingManager`` behind kvsim's manager
  interface, for the bench and the differential tests.
"""
