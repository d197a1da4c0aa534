"""``fracpilot policy``: read and change the decision engine's policies over NATS.

The decision service answers these requests (see ``fracpilot_decision.policy_store``; how a
policy is resolved: ``fracpilot_libs.sizing.policies``); each command prints JSON on stdout,
and on a refusal prints the reason on stderr and exits 1. ``get`` prints a policy that ``set``
accepts back (its ``revision`` is set by the store).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import nats
import typer

from fracpilot_libs import subjects
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import PolicyLevel, PolicyReply, PolicyScope
from fracpilot_libs.decoding import DecodeError, decode
from fracpilot_libs.nats_connect import NatsSecurityError, connect_once
from fracpilot_libs.nats_errors import NatsUnreachableError

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

policy_app = typer.Typer(
    help="Read and change the decision engine's policies (cluster < namespace < workload).",
    no_args_is_help=True,
)


class RequestFailedError(Exception):
    """No reply, or one that is not a policy reply."""


@policy_app.callback()
def _options(
    ctx: typer.Context,
    nats_url: Annotated[
        str, typer.Option(envvar="FRACPILOT_NATS_URL", help="NATS server URL(s), comma-separated")
    ] = DEFAULT_NATS_URL,
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to wait for a reply")] = 5.0,
) -> None:
    ctx.obj = (nats_url, timeout)


async def _request(url: str, subject: str, payload: bytes, wait_s: float) -> PolicyReply:
    errors: list[Exception] = []  # also a publish the server's permissions refuse, later
    try:  # with the services' FRACPILOT_NATS_* identity and TLS settings
        nc = await connect_once(
            ServiceSettings(nats={"url": url}), timeout_s=min(wait_s, 5.0), errors=errors
        )
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
    url, timeout = ctx.obj
    try:
        reply = asyncio.run(_request(url, subject, payload, timeout))
    except RequestFailedError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from exc
    if not reply.ok:
        typer.echo(f"error: {reply.error or 'refused without a reason'}", err=True)
        raise typer.Exit(code=1)
    return reply


def _echo_json(body: object) -> None:
    typer.echo(json.dumps(body, indent=2))


def _echo_policy(reply: PolicyReply) -> None:
    if reply.policy is None:
        typer.echo("error: the reply carries no policy", err=True)
        raise typer.Exit(code=1)
    _echo_json(reply.policy.model_dump(mode="json"))


@policy_app.command()
def get(
    ctx: typer.Context,
    namespace: Annotated[str | None, typer.Option(help="a namespace's policy")] = None,
    workload: Annotated[
        str | None, typer.Option(help="a workload's policy (needs --namespace)")
    ] = None,
) -> None:
    """Print the effective policy at a scope (the cluster's without options)."""
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
def list_(ctx: typer.Context) -> None:
    """Print every stored policy (a JSON array, ordered by scope)."""
    reply = _call(ctx, subjects.POLICY_LIST, b"")
    _echo_json([p.model_dump(mode="json") for p in reply.policies])
