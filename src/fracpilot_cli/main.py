"""The ``fracpilot`` command line."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fracpilot_cli.asyncapi import asyncapi_command
from fracpilot_cli.demo import DemoConfig, run_demo
from fracpilot_cli.operator_cli import explain_command, report_command, status_command
from fracpilot_cli.policy import policy_app
from fracpilot_cli.replay import replay_command

app = typer.Typer(
    help="fracpilot: an autopilot for fractional GPUs on Kubernetes.", no_args_is_help=True
)

app.add_typer(policy_app, name="policy")
app.command("replay")(replay_command)
app.command("status")(status_command)
app.command("explain")(explain_command)
app.command("report")(report_command)
app.command("asyncapi")(asyncapi_command)


@app.callback()
def _root() -> None:
    """fracpilot: observe GPU usage, decide fractions, apply them safely."""


@app.command()
def demo(
    workloads: Annotated[int, typer.Option(min=1, max=8, help="simulated workloads")] = 8,
    hours: Annotated[float, typer.Option(min=0.1, help="simulated hours to run")] = 24.0,
    speed: Annotated[float, typer.Option(min=1, help="simulated seconds per real second")] = 720,
    log_dir: Annotated[Path | None, typer.Option(help="where service logs go")] = None,
) -> None:
    """Run the three services on a simulated GPU cluster over an embedded NATS."""
    config = DemoConfig(workloads=workloads, sim_hours=hours, speed=speed, log_dir=log_dir)
    summary = asyncio.run(run_demo(config, Console()))
    if summary.samples < config.expected_samples:
        raise typer.Exit(code=1)


if __name__ == "__main__":
    app()
