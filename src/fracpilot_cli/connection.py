"""The settings a command connects to NATS with: the ``FRACPILOT_`` environment, then the
global options: ``--nats-url``, or the kubeconfig (``kubectl fracpilot``, ``--kubeconfig``,
``--context``, ``--release``, ``--release-namespace``), which finds the release's NATS and its
credentials and forwards a local port to it while the command runs
(:mod:`fracpilot_cli.kube_access`: as the read-only operator identity, or policy-admin for a
command that changes a policy)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NoReturn

import typer
from pydantic import ValidationError

from fracpilot_cli.options import GlobalOptions, OptionsError
from fracpilot_cli.settings import CliSettings

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2


def fail(command: str, message: str, code: int = EXIT_UNAVAILABLE) -> NoReturn:
    typer.echo(f"fracpilot {command}: error: {message}", err=True)
    raise typer.Exit(code=code)


def env_settings(command: str) -> CliSettings:
    try:
        return CliSettings()
    except ValidationError as exc:
        fail(command, f"invalid settings: {exc.errors(include_url=False)[0]['msg']}", EXIT_USAGE)


@contextlib.contextmanager
def cli_settings(
    command: str, opts: GlobalOptions, identity: str = "operator"
) -> Iterator[CliSettings]:
    """The command's settings, valid (and any port forward open) while the block runs.
    ``identity``: whose credentials the kubeconfig path reads (the environment and
    ``--nats-url`` take the FRACPILOT_NATS_* identity given)."""
    try:
        opts.check()
    except OptionsError as exc:
        fail(command, str(exc), EXIT_USAGE)
    settings = env_settings(command)
    if not opts.kube:
        if opts.nats_url:
            nats = settings.nats.model_copy(update={"url": opts.nats_url})
            settings = settings.model_copy(update={"nats": nats})
        yield settings
        return
    from fracpilot_cli.kube_access import KubeAccessError, KubeTarget, open_release_nats

    target = KubeTarget(opts.kubeconfig, opts.context, opts.release, opts.release_namespace)
    try:
        with open_release_nats(target, identity=identity) as opened:
            nats = settings.nats.model_copy(update=opened.nats)
            try:
                yield settings.model_copy(update={"nats": nats})
            finally:
                if opened.forwarder is not None and opened.forwarder.errors:
                    typer.echo(
                        f"fracpilot {command}: port forward to {opened.forwarded_to} "
                        f"failed: {opened.forwarder.errors[-1]}",
                        err=True,
                    )
    except KubeAccessError as exc:
        fail(command, str(exc))
