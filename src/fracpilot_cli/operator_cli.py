"""``fracpilot status``, ``explain`` and ``report``: what fracpilot believes and did, from NATS.

Each command has a module of its own (:mod:`fracpilot_cli.status_cli`,
:mod:`fracpilot_cli.explain_cli`, :mod:`fracpilot_cli.report_cli`), over how they fail
(:mod:`fracpilot_cli.command_failures`); the global options: :mod:`fracpilot_cli.options`, the
connection: :mod:`fracpilot_cli.connection`. This module is where the command line finds the
three (:data:`fracpilot_cli.main.LAZY_COMMANDS`), and holds the hint that names them.
Exit codes: 0 done, 1 NATS unreachable or nothing to show, 2 bad usage.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fracpilot_cli.bulk import bulk
from fracpilot_cli.connection import EXIT_UNAVAILABLE, EXIT_USAGE
from fracpilot_cli.explain_cli import EXPLAIN_FORMATS, explain_command, timeline_of
from fracpilot_cli.report_cli import parse_duration, report_command
from fracpilot_cli.status_cli import (
    DOCUMENTS,
    interrupt_flag,
    status_command,
    status_rows,
    status_view,
)

__all__ = [
    "DOCUMENTS",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "EXPLAIN_FORMATS",
    "bulk",
    "explain_command",
    "interrupt_flag",
    "operator_hint",
    "parse_duration",
    "program",
    "report_command",
    "status_command",
    "status_rows",
    "status_view",
    "timeline_of",
]


def program() -> str:
    """How to call this ``fracpilot``: its path beside the interpreter, relative when under the
    working directory (``.venv/bin/fracpilot``), else the name on PATH."""
    beside = Path(sys.executable).parent / "fracpilot"
    if not beside.exists():
        return "fracpilot"
    try:
        return str(beside.relative_to(Path.cwd()))
    except ValueError:
        return str(beside)


def operator_hint(nats_url: str, example: str, embedded: bool) -> str:
    """The three commands to try against a running pipeline (the demo prints them)."""
    run = f"FRACPILOT_NATS_URL={nats_url} {program()}"
    until = " (the embedded NATS stops with the demo)" if embedded else ""
    return "\n".join(
        [
            f"While it runs, in another terminal{until}:",
            f"  {run} status --watch",
            f"  {run} explain {example}",
            f"  {run} report --since 1h --out fracpilot-report",
        ]
    )
