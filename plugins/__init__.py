"""The plugin layer policies and routers share: finding a plugin by its entry point, checking its options against
its constructor, the one boundary its code is called through, and running its hooks on pluggy. It imports only
``kvsched.errors``; the core (policies' hooks) and ``routers/`` (routers' hooks) build on it."""
