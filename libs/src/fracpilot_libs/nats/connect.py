"""How a fracpilot process authenticates to NATS and secures the connection.

One of user/password (``FRACPILOT_NATS_USER``/``_PASSWORD``), an nkey seed file
(``FRACPILOT_NATS_NKEY_SEED_FILE``) or a creds file (``FRACPILOT_NATS_CREDS_FILE``, operator
mode), or none; TLS verified against ``FRACPILOT_NATS_TLS_CA_FILE``, mutual TLS when
``FRACPILOT_NATS_TLS_CERT_FILE`` and ``_KEY_FILE`` are given too. The services (through
:class:`fracpilot_libs.nats.bus.Bus`) and the CLI connect with :func:`open_connection`, so both read
the same settings and fail the same way: a setting that can never work, a certificate the
server does not trust or credentials it refuses raise :class:`NatsSecurityError` at once with
the reason, instead of being retried forever as if the server were down. A command of the CLI
connects once with :func:`connect_once`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.deadlines import cancel_and_wait
from fracpilot_libs.nats.errors import NatsUnreachableError, PermanentNatsError

# What a connection attempt fails with while the server cannot be reached (yet).
_UNREACHABLE = (OSError, nats.errors.NoServersError, TimeoutError)


class NatsSecurityError(PermanentNatsError):
    """A NATS connection that retrying cannot fix: bad settings, refused credentials or TLS."""


def _readable(setting: str, path: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise NatsSecurityError(f"FRACPILOT_{setting.upper()}={path}: no such file")
    try:
        p.read_bytes()
    except OSError as exc:
        raise NatsSecurityError(f"FRACPILOT_{setting.upper()}={path}: {exc.strerror}") from exc
    return p


def tls_context(settings: ServiceSettings) -> ssl.SSLContext | None:
    """The client's TLS context, or None when no TLS setting is given."""
    s = settings
    if not (s.nats.tls_ca_file or s.nats.tls_cert_file or s.nats.tls_key_file):
        return None
    if bool(s.nats.tls_cert_file) != bool(s.nats.tls_key_file):
        raise NatsSecurityError(
            "mutual TLS needs both FRACPILOT_NATS_TLS_CERT_FILE and FRACPILOT_NATS_TLS_KEY_FILE"
        )
    try:
        if s.nats.tls_ca_file:
            ca = _readable("nats_tls_ca_file", s.nats.tls_ca_file)
            context = ssl.create_default_context(cafile=str(ca))
        else:  # the server's certificate is signed by a public CA
            context = ssl.create_default_context()
    except ssl.SSLError as exc:
        raise NatsSecurityError(
            f"FRACPILOT_NATS_TLS_CA_FILE={s.nats.tls_ca_file}: not a PEM CA certificate ({exc})"
        ) from exc
    if s.nats.tls_cert_file and s.nats.tls_key_file:
        cert = _readable("nats_tls_cert_file", s.nats.tls_cert_file)
        key = _readable("nats_tls_key_file", s.nats.tls_key_file)
        try:
            context.load_cert_chain(str(cert), str(key))
        except ssl.SSLError as exc:
            raise NatsSecurityError(
                f"FRACPILOT_NATS_TLS_CERT_FILE={cert} / FRACPILOT_NATS_TLS_KEY_FILE={key}: "
                f"not a matching PEM certificate and key ({exc})"
            ) from exc
    return context


def server_urls(settings: ServiceSettings) -> list[str]:
    """The servers of ``FRACPILOT_NATS_URL`` (comma-separated)."""
    return [u.strip() for u in settings.nats.url.split(",")]


def client_options(
    settings: ServiceSettings,
    *,
    connect_timeout_s: float,
    keep_reconnecting: bool,
    name: str | None = None,
) -> dict[str, Any]:
    """nats-py ``connect`` options of a fracpilot connection, but for identity and TLS (which
    :func:`open_connection` adds): a service's reconnects forever (``keep_reconnecting``), a
    command's connects once and fails fast (each server tried twice)."""
    options: dict[str, Any] = {
        "servers": server_urls(settings),
        "connect_timeout": connect_timeout_s,
    }
    if keep_reconnecting:
        options |= {"max_reconnect_attempts": -1, "reconnect_time_wait": 1, "allow_reconnect": True}
    else:  # each server twice, then give up
        options |= {
            "allow_reconnect": False,
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0.1,
        }
    if name is not None:
        options["name"] = name
    return options


def connect_options(settings: ServiceSettings) -> dict[str, Any]:
    """nats-py ``connect`` options for the configured identity and TLS (checked here)."""
    s = settings
    if bool(s.nats.user) != bool(s.nats.password):
        raise NatsSecurityError(
            "FRACPILOT_NATS_USER and FRACPILOT_NATS_PASSWORD go together: set both or neither"
        )
    identities = [
        name
        for name, value in (
            ("FRACPILOT_NATS_USER", s.nats.user),
            ("FRACPILOT_NATS_CREDS_FILE", s.nats.creds_file),
            ("FRACPILOT_NATS_NKEY_SEED_FILE", s.nats.nkey_seed_file),
        )
        if value
    ]
    if len(identities) > 1:
        raise NatsSecurityError(f"choose one NATS identity, not {' and '.join(identities)}")
    options: dict[str, Any] = {}
    if s.nats.user:
        options["user"], options["password"] = s.nats.user, s.nats.password
    if s.nats.creds_file:
        creds = _readable("nats_creds_file", s.nats.creds_file)
        if b"BEGIN NATS USER JWT" not in creds.read_bytes():
            raise NatsSecurityError(
                f"FRACPILOT_NATS_CREDS_FILE={creds}: not a NATS creds file (no user JWT)"
            )
        options["user_credentials"] = str(creds)
    if s.nats.nkey_seed_file:
        seed = _readable("nats_nkey_seed_file", s.nats.nkey_seed_file)
        if not seed.read_bytes().strip().startswith(b"SU"):
            raise NatsSecurityError(
                f"FRACPILOT_NATS_NKEY_SEED_FILE={seed}: not a user nkey seed (one line, SU...)"
            )
        options["nkeys_seed"] = str(seed)  # nats-py reads it for each signature
    if (context := tls_context(s)) is not None:
        options["tls"] = context
    return options


def permanent_error(exc: BaseException, settings: ServiceSettings) -> str | None:
    """Why a connection attempt will fail again however often it is retried (None: it may not)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = (
            f"it does not verify against FRACPILOT_NATS_TLS_CA_FILE={settings.nats.tls_ca_file}"
            if settings.nats.tls_ca_file
            else "set FRACPILOT_NATS_TLS_CA_FILE to the CA that signed it"
        )
        return f"the NATS server's TLS certificate is not trusted ({exc.verify_message}): {hint}"
    if isinstance(exc, ssl.SSLError):
        hint = (
            ""
            if settings.nats.tls_cert_file
            else " (a server verifying clients needs FRACPILOT_NATS_TLS_CERT_FILE and _KEY_FILE)"
        )
        return f"TLS handshake with the NATS server failed: {exc}{hint}"
    text = str(exc).lower()
    if "authorization violation" in text or "authorization failed" in text:
        return (
            "the NATS server refused this identity (authorization violation): check "
            "FRACPILOT_NATS_USER/_PASSWORD, _NKEY_SEED_FILE or _CREDS_FILE"
        )
    if "authentication" in text and ("expired" in text or "revoked" in text):
        return f"the NATS server refused these credentials: {exc}"
    return None


async def open_connection(settings: ServiceSettings, **options: Any) -> NatsClient:
    """Connect with ``options`` plus the configured identity and TLS.

    nats-py retries a refused identity or an untrusted certificate as it retries an
    unreachable server (forever, with ``max_reconnect_attempts=-1``); here such an error ends
    the attempt with :class:`NatsSecurityError` (permanent); an unreachable server raises
    :class:`~fracpilot_libs.nats.errors.NatsUnreachableError` (transient), for the caller's
    retry policy.
    """
    all_options = {**options, **connect_options(settings)}
    caller_error_cb = options.get("error_cb")
    refused: list[str] = []
    gave_up = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        if not nc.is_connected and (why := permanent_error(exc, settings)) is not None:
            refused.append(why)
            gave_up.set()
        if caller_error_cb is not None:
            await caller_error_cb(exc)

    all_options["error_cb"] = on_error
    nc = NatsClient()
    connecting = asyncio.ensure_future(nc.connect(**all_options))
    waiting = asyncio.ensure_future(gave_up.wait())
    try:
        await asyncio.wait({connecting, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if not connecting.done():  # a permanent error while nats-py would go on retrying
        try:
            with contextlib.suppress(Exception):  # the refusal is the error to raise
                await cancel_and_wait(connecting)
        finally:  # closed though the caller is cancelled meanwhile
            with contextlib.suppress(Exception):
                await nc.close()
        raise NatsSecurityError(refused[0])
    if (exc := connecting.exception()) is not None:
        if (why := permanent_error(exc, settings)) is not None:
            raise NatsSecurityError(why) from exc
        if isinstance(exc, _UNREACHABLE):
            raise NatsUnreachableError(str(exc)) from exc
        raise exc
    if all_options.get("tls") is not None and not _server_requires_tls(nc):
        await nc.close()
        raise NatsSecurityError(
            "TLS is configured (FRACPILOT_NATS_TLS_*) but the NATS server at "
            f"{settings.nats.url} does not offer it: refusing to talk in plain text"
        )
    return nc


def _server_requires_tls(nc: NatsClient) -> bool:
    info: dict[str, Any] = getattr(nc, "_server_info", None) or {}
    return bool(info.get("tls_required"))


async def connect_once(
    settings: ServiceSettings,
    *,
    timeout_s: float,
    name: str | None = None,
    errors: list[Exception] | None = None,
) -> NatsClient:
    """Connect once, no reconnecting, failing fast (a command, not a service, is waiting).

    Raises :class:`NatsSecurityError`, or :class:`NatsUnreachableError` with the last error
    nats-py reported (instead of its logged tracebacks). ``errors`` collects every error the
    connection reports, during and after connecting (a refused publish, for instance)."""
    seen = errors if errors is not None else []

    async def remember(exc: Exception) -> None:
        seen.append(exc)

    options = client_options(
        settings, connect_timeout_s=timeout_s, keep_reconnecting=False, name=name
    )
    options["error_cb"] = remember
    try:
        return await open_connection(settings, **options)
    except NatsSecurityError:
        raise
    except Exception as exc:
        cause = seen[-1] if seen else exc
        raise NatsUnreachableError(str(cause)) from exc
