"""What a run reports: results and their tables, `vllm bench serve` metrics,
vLLM's offload metric names, progress bars."""
