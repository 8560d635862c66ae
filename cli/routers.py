"""``engine routers``: the installed routing policies (entry-point group ``kvsched.routers``)."""

from __future__ import annotations


def routers() -> None:
    """List installed routers: name, distribution, version, description."""
    from rich.table import Table

    from kvsched.cli.common import console
    from kvsched.core.errors import KvschedError
    from kvsched.core.plugins import describe
    from kvsched.routers.plugins import available_routers, load_router

    table = Table(title="installed routers (entry-point group kvsched.routers)")
    for col in ("name", "distribution", "version", "description"):
        table.add_column(col, overflow="fold")
    for info in available_routers().values():
        try:
            text = describe(load_router(info.name))
        except KvschedError as exc:  # a broken third-party router must not hide the others
            text = f"(fails to load: {exc})"
        table.add_row(info.name, info.distribution, info.version, text)
    console.print(table)


def register(app) -> None:
    from kvsched.cli.common import cli_errors

    app.command()(cli_errors(routers))
