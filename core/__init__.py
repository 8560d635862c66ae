"""The engine a policy author reads: requests and sequences, config, hooks, views, the step builder, the scheduler
and the engine loop. It imports only ``kvsched.allocators``, ``.plugins`` and ``.errors``; ``kvsched`` re-exports it."""
