"""``fracpilot explain``: a workload's decision timeline from NATS.

Glue only: the NATS reads (:mod:`fracpilot_cli.operator_data`), the pure cores
(:mod:`fracpilot_cli.explain`, :mod:`fracpilot_cli.status`), their data for the output layer
(:mod:`fracpilot_cli.render`, :mod:`fracpilot_cli.output`).
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from typing import Annotated

import typer

from fracpilot_cli import options, output, render
from fracpilot_cli.command_failures import chosen_format, fail
from fracpilot_cli.connection import EXIT_USAGE, cli_settings
from fracpilot_cli.explain import DecisionTimeline, build_timeline
from fracpilot_cli.operator_data import NatsUnavailableError, connect, read_one, read_workload
from fracpilot_cli.settings import CliSettings
from fracpilot_cli.status import build_status_rows
from fracpilot_libs.contracts import WorkloadRef


async def timeline_of(settings: CliSettings, namespace: str, name: str) -> DecisionTimeline:
    nc = await connect(settings)
    try:
        decisions, results = await read_workload(nc, namespace, name)
        timeline = build_timeline(namespace, name, decisions, results)
        known = timeline.workload if timeline.entries else None
        snapshot, policies = await read_one(nc, namespace, name, known)
    finally:
        await nc.close()
    rows = build_status_rows(snapshot, policies.for_workload, settings.prices, datetime.now(UTC))
    status = next((r for r in rows if r.namespace == namespace and r.workload == name), None)
    workload = timeline.workload
    if status is not None and not timeline.entries:
        workload = WorkloadRef(
            cluster=status.cluster,
            namespace=namespace,
            owner_kind=status.kind,
            owner_name=name,
        )
    return DecisionTimeline(workload, timeline.entries, status)


EXPLAIN_FORMATS = ("text", *output.FORMATS)


@options.takes(options.READER)
def explain_command(
    workload: Annotated[str, typer.Argument(metavar="[NAMESPACE/]WORKLOAD")],
) -> None:
    """The workload's decision timeline, newest first: each decision's explanation (the rule,
    the numbers, the policy revision) and what the actuator did with it (plan, outcome, where
    the pod went, the detail or error it reported), from the decisions and actuations streams.

    -o text (default: the timeline as prose), table or wide (a row per decision and its last
    action), json or yaml (the whole timeline), csv (a row per decision). The workload is
    NAMESPACE/WORKLOAD, or WORKLOAD with -n NAMESPACE.
    """
    opts = options.given()
    fmt = chosen_format("explain", opts, "text", EXPLAIN_FORMATS)
    if opts.all_namespaces:
        fail("explain", "-A: explain names one workload (NAMESPACE/WORKLOAD)", EXIT_USAGE)
    namespace, _, name = workload.rpartition("/")
    namespace = namespace or opts.namespace or ""
    if not namespace or not name or "/" in namespace:
        fail("explain", f"{workload!r}: expected NAMESPACE/WORKLOAD (or -n NAMESPACE)", EXIT_USAGE)
    with cli_settings("explain", opts) as settings:
        try:
            timeline = asyncio.run(timeline_of(settings, namespace, name))
        except NatsUnavailableError as exc:
            fail("explain", str(exc))
        url = settings.nats.url
    if not timeline.entries and timeline.status is None:
        fail("explain", f"nothing recorded about {namespace}/{name} at {url}")
    if fmt != "text":
        output.emit(render.timeline_listing(timeline), fmt)
        return
    lines = render.timeline_lines(timeline)
    if not timeline.entries:
        lines.append("No decisions recorded (the engine has not asked for a change).")
    sys.stdout.write("\n".join(lines).rstrip("\n") + "\n")
