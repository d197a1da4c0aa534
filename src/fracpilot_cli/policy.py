"""``fracpilot policy``: read and change the decision engine's policies over NATS.

The decision service answers these requests (see ``fracpilot_decision.policy_store``; how a
policy is resolved: ``fracpilot_libs.sizing.policies``); each command prints JSON on stdout by
default (``-o table|wide|yaml|csv`` too, through :mod:`fracpilot_cli.output`), and on a
refusal prints the reason on stderr and exits 1. ``get`` prints a policy that ``set`` accepts
back (its ``revision`` is set by the store). NATS is reached as by the other commands
(:mod:`fracpilot_cli.connection`: the environment, ``--nats-url`` or the kubeconfig).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import nats
import typer

from fracpilot_cli import options, output
from fracpilot_cli.connection import EXIT_USAGE, cli_settings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Policy, PolicyLevel, PolicyReply, PolicyScope
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.connect import NatsSecurityError, connect_once
from fracpilot_libs.nats.decoding import DecodeError, decode
from fracpilot_libs.nats.errors import NatsUnreachableError

policy_app = typer.Typer(
    help="Read and change the decision engine's policies (cluster < namespace < workload).",
    no_args_is_help=True,
)


class RequestFailedError(Exception):
    """No reply, or one that is not a policy reply."""


@policy_app.callback()
@options.takes(options.READER)
def _options(
    ctx: typer.Context,
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to wait for a reply")] = 5.0,
) -> None:
    ctx.obj = timeout


async def _request(
    settings: ServiceSettings, subject: str, payload: bytes, wait_s: float
) -> PolicyReply:
    errors: list[Exception] = []  # also a publish the server's permissions refuse, later
    url = settings.nats.url
    try:  # with the FRACPILOT_NATS_* identity and TLS settings (or the kubeconfig's)
        nc = await connect_once(settings, timeout_s=min(wait_s, 5.0), errors=errors)
    except (NatsSecurityError, NatsUnreachableError) as exc:
        raise RequestFailedError(f"cannot connect to NATS at {url}: {exc}") from exc
    try:
        msg = await nc.request(subject, payload, timeout=wait_s)
    except nats.errors.NoRespondersError as exc:
        raise RequestFailedError(
            f"no decision service answers on {subject}: is it running?"
        ) from exc
    except (nats.errors.TimeoutError, TimeoutError) as exc:
        # A publish the server's permissions refuse is dropped: say so rather than "no reply".
        denied = [e for e in errors if "permissions violation" in str(e).lower()]
        if denied:
            raise RequestFailedError(
                f"not allowed: the NATS server refused this identity ({denied[-1]})"
            ) from exc
        raise RequestFailedError(f"no reply on {subject} within {wait_s:g} s") from exc
    finally:
        await nc.close()
    try:
        return decode(PolicyReply, msg.data)
    except DecodeError as exc:
        raise RequestFailedError(f"unexpected reply on {subject}: {exc.reason}") from exc


def _call(ctx: typer.Context, subject: str, payload: bytes) -> PolicyReply:
    timeout = ctx.obj
    _format()  # a bad -o is a usage error before anything is sent
    # Through the kubeconfig, reading is the operator's and changing policy-admin's: the
    # Kubernetes RBAC on their Secrets decides who may do which.
    identity = "policy-admin" if subject == subjects.POLICY_SET else "operator"
    try:
        with cli_settings("policy", options.given(), identity=identity) as settings:
            reply = asyncio.run(_request(settings, subject, payload, timeout))
    except RequestFailedError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from exc
    if not reply.ok:
        typer.echo(f"error: {reply.error or 'refused without a reason'}", err=True)
        raise typer.Exit(code=1)
    return reply


def _format() -> str:
    """-o (json by default: what ``set`` takes back)."""
    try:
        return output.choose(options.given().format(), "json")
    except (output.FormatError, options.OptionsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=EXIT_USAGE) from exc


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


POLICY_COLUMNS: tuple[output.Column[Policy], ...] = (
    output.Column("SCOPE", lambda p: p.scope.key),
    output.Column("MODE", lambda p: p.mode.value),
    output.Column("MIN", lambda p: _cell(p.min_fraction)),
    output.Column("MAX", lambda p: _cell(p.max_fraction)),
    output.Column("GRID", lambda p: p.grid.value),
    output.Column("REVISION", lambda p: str(p.revision)),
    output.Column("STEPS", lambda p: str(p.grid_steps), wide=True),
    output.Column("LEVELS", lambda p: _cell(list(p.grid_levels)), wide=True),
    output.Column("COMPUTE-SIZING", lambda p: p.compute_sizing.value, wide=True),
    output.Column("PERCENTILE", lambda p: _cell(p.compute_percentile), wide=True),
    output.Column("TARGET-UTIL", lambda p: _cell(p.target_utilization), wide=True),
)


def policy_listing(policies: list[Policy], one: bool) -> output.Listing[Policy]:
    """Policies as data: a row each; the document is one policy (``one``) or the array."""
    dumped = [p.model_dump(mode="json") for p in policies]
    return output.Listing(
        rows=policies,
        columns=POLICY_COLUMNS,
        document=lambda: dumped[0] if one else dumped,
        record=lambda p: p.model_dump(mode="json"),
    )


def _echo(policies: list[Policy], one: bool) -> None:
    fmt = _format()
    listing = policy_listing(policies, one)
    if fmt == "json":  # as before: the standard library's layout
        typer.echo(json.dumps(listing.document(), indent=2))
    else:
        output.emit(listing, fmt)


def _echo_policy(reply: PolicyReply) -> None:
    if reply.policy is None:
        typer.echo("error: the reply carries no policy", err=True)
        raise typer.Exit(code=1)
    _echo([reply.policy], one=True)


@policy_app.command()
@options.takes(options.READER)
def get(
    ctx: typer.Context,
    workload: Annotated[
        str | None, typer.Option(help="a workload's policy (needs --namespace)")
    ] = None,
) -> None:
    """Print the effective policy at a scope: -n/--namespace a namespace's, with --workload
    a workload's, the cluster's without either. -o json (default; what set takes back), yaml,
    table, wide or csv."""
    namespace = options.given().namespace
    if workload is not None and namespace is None:
        raise typer.BadParameter("--workload needs --namespace", param_hint="--workload")
    level = (
        PolicyLevel.WORKLOAD
        if workload is not None
        else PolicyLevel.NAMESPACE
        if namespace is not None
        else PolicyLevel.CLUSTER
    )
    scope = PolicyScope(level=level, namespace=namespace, workload=workload)
    _echo_policy(_call(ctx, subjects.POLICY_GET, scope.to_json()))


@policy_app.command("set")
@options.takes(options.READER)
def set_(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="a policy as JSON; - reads standard input")],
) -> None:
    """Store a policy (validated by the decision service) and print it as stored."""
    try:
        data = typer.get_binary_stream("stdin").read() if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        typer.echo(f"error: cannot read {file}: {exc.strerror or exc}", err=True)
        raise typer.Exit(code=1) from exc
    _echo_policy(_call(ctx, subjects.POLICY_SET, data))


@policy_app.command("list")
@options.takes(options.READER)
def list_(ctx: typer.Context) -> None:
    """Print every stored policy, ordered by scope (with -n: that namespace's and its
    workloads'): -o json (default: an array), yaml, table, wide or csv (a row per policy)."""
    try:
        namespace = options.given().namespaces()
    except options.OptionsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=EXIT_USAGE) from exc
    reply = _call(ctx, subjects.POLICY_LIST, b"")
    policies = [p for p in reply.policies if namespace in (None, p.scope.namespace)]
    _echo(policies, one=False)
