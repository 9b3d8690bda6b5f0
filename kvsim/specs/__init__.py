"""What the hardware and the model are: model presets and Hugging Face configs,
GPU presets, and vLLM's sizing arithmetic (bytes -> chunks and blocks)."""
