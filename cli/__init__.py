"""The ``engine`` command line: every typer command, on top of every other package."""
