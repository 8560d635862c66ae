"""``engine routers``: the installed routing policies (entry-point group ``kvsched.routers``)."""

from __future__ import annotations


def routers() -> None:
    """List installed routers: name, distribution, version, description (DIST:NAME where two register a name)."""
    from kvsched.cli.common import print_plugins
    from kvsched.routers.plugins import describe_router, installed_routers

    print_plugins("router", installed_routers(), describe_router)


def register(app) -> None:
    from kvsched.cli.common import cli_errors

    app.command()(cli_errors(routers))
