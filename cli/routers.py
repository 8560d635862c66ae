"""``engine routers``: the installed routing policies (entry-point group ``kvsched.routers``)."""

from __future__ import annotations


def routers() -> None:
    """List installed routers: name, distribution, version, description."""
    from kvsched.cli.common import print_plugins
    from kvsched.routers.plugins import available_routers, load_router

    print_plugins("installed routers (entry-point group kvsched.routers)",
                  ((i.name, i.distribution, i.version, lambda i=i: load_router(i.name)) for i in available_routers().values()))


def register(app) -> None:
    from kvsched.cli.common import cli_errors

    app.command()(cli_errors(routers))
