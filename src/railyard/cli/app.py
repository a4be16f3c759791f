"""The `railyard` command: one Typer app; each subcommand lives in its own module."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

app = typer.Typer(
    name="railyard",
    help="Schedule RDMA NICs (SR-IOV VFs and PFs) jointly with GPUs, paired GPU i <-> NIC i.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: str, code: int = 2) -> NoReturn:
    """End a command with a one-line error on stderr instead of a traceback."""
    print(f"railyard: error: {message}", file=sys.stderr)
    raise typer.Exit(code)
