"""The ``fracpilot`` command line.

Each command's module is imported when that command runs, not before: ``fracpilot status``
need not load the demo, the replay or the AsyncAPI generator (together over half a second of
a large fleet's two-second budget).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from fracpilot_cli import options

# command name -> (module, attribute): a command function, or a Typer app of subcommands
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "asyncapi": ("fracpilot_cli.asyncapi", "asyncapi_command"),
    "explain": ("fracpilot_cli.operator_cli", "explain_command"),
    "policy": ("fracpilot_cli.policy", "policy_app"),
    "recommend": ("fracpilot_cli.recommend", "recommend_command"),
    "replay": ("fracpilot_cli.replay", "replay_command"),
    "report": ("fracpilot_cli.operator_cli", "report_command"),
    "status": ("fracpilot_cli.operator_cli", "status_command"),
}

# commands that only read NATS over TCP: they need no websocket client (see :func:`main`)
READERS = frozenset({"explain", "report", "status"})


def without_websocket_client(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Keep nats-py from importing aiohttp, a third of its import time, which it loads only
    for ``ws://`` servers: true (and done) when no ``ws://``/``wss://`` URL is in sight."""
    given = [*argv, environ.get("FRACPILOT_NATS_URL", "")]
    if any("ws://" in a or "wss://" in a for a in given) or "aiohttp" in sys.modules:
        return False
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # nats-py: "not installed"
    return True


def lazy_command(name: str) -> Any:
    """The click command for ``name``, its module imported now."""
    module, attribute = LAZY_COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        group = typer.main.get_group(target)
        group.name = name
        return group
    single = typer.Typer()
    single.command(name, short_help=first_paragraph(target.__doc__ or ""))(target)
    return typer.main.get_command(single)


def first_paragraph(doc: str) -> str:
    """A docstring's first paragraph on one line (the command list wraps it itself)."""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


class LazyCommands(TyperGroup):
    """The commands defined here, then those of :data:`LAZY_COMMANDS`, loaded when asked for."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in LAZY_COMMANDS:
            return lazy_command(cmd_name)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    cls=LazyCommands,
    help="fracpilot: an autopilot for fractional GPUs on Kubernetes.",
    no_args_is_help=True,
)


def version() -> str:
    """The release: the ``fracpilot`` distribution's version, which the workspace members, the
    chart (version and appVersion) and the images' labels share (tests/unit/test_version.py)."""
    return importlib.metadata.version("fracpilot")


def _print_version(asked: bool) -> None:
    if asked:
        print(f"fracpilot {version()}")
        raise typer.Exit()


@app.callback()
@options.takes(options.ALL)
def _root(
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """fracpilot: observe GPU usage, decide fractions, apply them safely.

    The global options go before the command or after it (fracpilot -o json status and
    fracpilot status -o json are the same). As a kubectl plugin (kubectl fracpilot ...) the
    commands reach NATS through the kubeconfig: a port forward to the release's NATS, with the
    credentials from its Secret.
    """
    # asyncio warns "returning true from eof_received() has no effect when using ssl" when a
    # TLS NATS connection ends; that is noise in a command whose output is data (-o json).
    logging.getLogger("asyncio").setLevel(logging.ERROR)


@app.command()
def demo(
    workloads: Annotated[int, typer.Option(min=1, max=8, help="simulated workloads")] = 8,
    hours: Annotated[float, typer.Option(min=0.1, help="simulated hours to run")] = 24.0,
    speed: Annotated[float, typer.Option(min=1, help="simulated seconds per real second")] = 720,
    log_dir: Annotated[Path | None, typer.Option(help="where service logs go")] = None,
) -> None:
    """Run the three services on a simulated GPU cluster over an embedded NATS."""
    from rich.console import Console

    from fracpilot_cli.demo import DemoConfig, run_demo

    config = DemoConfig(workloads=workloads, sim_hours=hours, speed=speed, log_dir=log_dir)
    summary = asyncio.run(run_demo(config, Console()))
    if summary.samples < config.expected_samples:
        raise typer.Exit(code=1)


def command_name(argv: Sequence[str]) -> str | None:
    """The command in ``argv`` (after the program), global options and their values skipped."""
    takes_value = options.VALUE_FLAGS
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in takes_value:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def main() -> None:
    """The ``fracpilot`` console script. Only here, in a process of its own, does a reader
    command keep the websocket client out; ``app`` run in-process (tests) changes nothing."""
    if command_name(sys.argv[1:]) in READERS:
        without_websocket_client(sys.argv, os.environ)
    app()


def kubectl_plugin() -> None:
    """The ``kubectl-fracpilot`` console script: ``kubectl fracpilot ...`` runs this, which is
    ``fracpilot`` reaching NATS through the kubeconfig (unless ``--nats-url`` is given)."""
    options.set_via_kubeconfig(True)
    if command_name(sys.argv[1:]) in READERS:
        without_websocket_client(sys.argv, os.environ)
    app(prog_name="kubectl fracpilot")


if __name__ == "__main__":
    main()
