"""Where kvsched policies run inside other serving engines (vLLM's scheduler seam)."""
