"""What a user asks for: offload options, vLLM's connector config, tier specs,
validated once at the edge into resolved configurations."""
