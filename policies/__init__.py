"""Built-in scheduling policies, each registered under the ``kvsched.policies`` entry-point group."""
