"""Bridges from kvsim to serving engines. Each bridge imports its engine lazily, so
importing kvsim never imports vLLM (or anything else heavy)."""
