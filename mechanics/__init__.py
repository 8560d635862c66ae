"""Whose engine the core follows: vLLM v0's and V1's mechanics (``engines.py``), each the rules a step takes blocks
by (``step_v1.py`` beside the core's own), what ``n > 1`` is (``fanout.py``) and how a step completes
(``completion.py``, ``async_lag.py``). The core finds them by ``EngineConfig.vllm_engine`` among the entry points
``kvsched.mechanics``, as it finds its fallback policy."""
