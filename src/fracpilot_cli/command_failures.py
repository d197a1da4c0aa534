"""How the operator commands (status, explain, report) fail and warn: one line on stderr,
``fracpilot COMMAND: error: ...``, and the exit code (:mod:`fracpilot_cli.connection`'s);
and the global options they read, a bad one a usage error."""

from __future__ import annotations

from typing import NoReturn

import typer

from fracpilot_cli import options, output
from fracpilot_cli.connection import EXIT_UNAVAILABLE, EXIT_USAGE


def fail(command: str, message: str, code: int = EXIT_UNAVAILABLE) -> NoReturn:
    typer.echo(f"fracpilot {command}: error: {message}", err=True)
    raise typer.Exit(code=code)


def warn_problems(command: str, problems: list[str]) -> None:
    if problems:
        n = len(problems)
        typer.echo(
            f"fracpilot {command}: warning: {n} {'entry' if n == 1 else 'entries'} did not "
            f"decode and {'is' if n == 1 else 'are'} left out; first: {problems[0]}",
            err=True,
        )


def chosen_format(
    command: str, opts: options.GlobalOptions, default: str, allowed: tuple[str, ...]
) -> str:
    try:
        return output.choose(opts.format(), default, allowed)
    except output.FormatError as exc:
        fail(command, str(exc), EXIT_USAGE)
    except options.OptionsError as exc:  # --json with another -o
        fail(command, str(exc), EXIT_USAGE)


def chosen_namespaces(command: str, opts: options.GlobalOptions) -> str | None:
    try:
        return opts.namespaces()
    except options.OptionsError as exc:
        fail(command, str(exc), EXIT_USAGE)
