"""kvsched: vLLM's scheduler and paged KV-cache block manager, with policies as pluggy plugins.

The package root stays import-light (no torch, no plugin loading) because the pytest plugin and
the CLI import it at start-up.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvsched")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
