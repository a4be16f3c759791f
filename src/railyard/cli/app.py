"""The `railyard` command: one Typer app; each subcommand lives in its own module."""

from __future__ import annotations

import sys
from typing import Annotated, Any, NoReturn

import typer

# typer 0.26+ carries its own copy of click and no longer installs click itself; its
# exceptions are the ones typer raises (the floor in pyproject.toml, decision 0102).
from typer._click import exceptions as click


class _Railyard(typer.Typer):
    """Usage errors (unknown option, bad choice, missing argument) as one line and exit 2,
    like every error a command reports itself (`fail`), instead of a framed help excerpt."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        kwargs.setdefault("prog_name", "railyard")  # also under `python -m railyard.cli.main`
        try:
            rv = super().__call__(*args, **kwargs)
        except click.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:
                print(e.ctx.get_help())  # a bare `railyard` or `railyard cni`: say what exists
                sys.exit(e.exit_code)
            where = e.ctx.command_path if e.ctx is not None else self.info.name
            print(f"{where}: error: {e.format_message()} (see {where} --help)", file=sys.stderr)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            print(f"railyard: error: {e.format_message()}", file=sys.stderr)
            sys.exit(e.exit_code)
        except typer.Abort:
            print("railyard: aborted", file=sys.stderr)
            sys.exit(1)
        # Not standalone, click returns the exit code of typer.Exit, or a command's value.
        if rv == 130:  # typer 0.26+ turns Ctrl-C (KeyboardInterrupt) into Exit(130), silently
            print("railyard: interrupted", file=sys.stderr)
        sys.exit(rv if isinstance(rv, int) else 0)


app = _Railyard(
    name="railyard",
    help="Schedule RDMA NICs (SR-IOV VFs and PFs) jointly with GPUs, paired GPU i <-> NIC i.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def package_version() -> str:
    """This install's version, as pip recorded it (pyproject.toml's `version`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("railyard")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        print(f"railyard {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the installed version and exit.")] = False,
) -> None:
    """Options of `railyard` itself, before any command (the app's `help` describes it)."""


def fail(message: str, code: int = 2) -> NoReturn:
    """End a command with a one-line error on stderr instead of a traceback."""
    print(f"railyard: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


# The API client's limits, the same for every service that talks to the API server.
KubeQps = Annotated[float, typer.Option(
    "--kube-qps", metavar="N", help="Client-side limit on API requests per second.")]
KubeBurst = Annotated[int, typer.Option(
    "--kube-burst", metavar="N", help="API requests allowed at once above --kube-qps.")]


def check_kube_limits(qps: float, burst: int) -> None:
    if qps <= 0 or burst < 1:
        fail("--kube-qps must be above 0 and --kube-burst at least 1")
