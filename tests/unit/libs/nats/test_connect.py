"""NATS identity and TLS settings: a combination that can never work is refused before any
connection attempt, with a reason that names the setting."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats.connect import (
    NatsSecurityError,
    connect_once,
    connect_options,
    permanent_error,
)
from fracpilot_libs.nats.errors import NatsUnreachableError, PermanentNatsError, TransientNatsError
from support.nats_auth import make_tls_files, make_user_nkey

THIS_FILE = __file__  # an existing file that is neither creds nor a certificate


def settings(**fields: str) -> ServiceSettings:
    """Settings with these ``nats`` group fields, named as in the environment (``nats_user``)."""
    nats = {name.removeprefix("nats_"): value for name, value in fields.items()}
    return ServiceSettings(nats={"url": "nats://127.0.0.1:4222", **nats})


def test_no_settings_mean_no_identity_and_no_tls() -> None:
    assert connect_options(settings()) == {}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"nats_user": "ingest"}, "go together"),
        ({"nats_password": "secret"}, "go together"),
        (
            {"nats_user": "ingest", "nats_password": "x", "nats_creds_file": THIS_FILE},
            "choose one NATS identity",
        ),
        ({"nats_nkey_seed_file": "/nonexistent/seed"}, "FRACPILOT_NATS_NKEY_SEED_FILE"),
        ({"nats_creds_file": THIS_FILE}, "not a NATS creds file"),
        ({"nats_tls_cert_file": THIS_FILE}, "needs both"),
        ({"nats_tls_ca_file": "/nonexistent/ca.pem"}, "FRACPILOT_NATS_TLS_CA_FILE"),
    ],
)
def test_an_impossible_combination_is_refused_with_the_setting_named(
    fields: dict[str, str], reason: str
) -> None:
    with pytest.raises(NatsSecurityError, match=reason):
        connect_options(settings(**fields))


def test_a_file_that_is_not_a_pem_ca_is_refused(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello")
    with pytest.raises(NatsSecurityError, match="not a PEM CA"):
        connect_options(settings(nats_tls_ca_file=str(not_pem)))


def test_tls_and_nkey_options(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "tls")
    seed = tmp_path / "user.nk"
    make_user_nkey(seed)
    options = connect_options(
        settings(
            nats_nkey_seed_file=str(seed),
            nats_tls_ca_file=str(tls.ca),
            nats_tls_cert_file=str(tls.client_cert),
            nats_tls_key_file=str(tls.client_key),
        )
    )
    assert options["nkeys_seed"] == str(seed)
    context = options["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
    swapped = settings(nats_tls_cert_file=str(tls.client_key), nats_tls_key_file=str(tls.ca))
    with pytest.raises(NatsSecurityError, match="not a matching PEM certificate and key"):
        connect_options(swapped)


def test_which_connection_errors_are_permanent() -> None:
    s = settings()
    assert permanent_error(ConnectionRefusedError(), s) is None
    assert permanent_error(TimeoutError(), s) is None
    refused = permanent_error(Exception("nats: 'Authorization Violation'"), s)
    assert refused is not None
    assert "refused this identity" in refused
    untrusted = ssl.SSLCertVerificationError("certificate verify failed")
    untrusted.verify_message = "unable to get local issuer certificate"
    why = permanent_error(untrusted, s)
    assert why is not None
    assert "set FRACPILOT_NATS_TLS_CA_FILE" in why


async def test_an_unreachable_server_is_a_transient_error_and_refusals_are_permanent() -> None:
    settings = ServiceSettings(nats={"url": "nats://127.0.0.1:1"})
    errors: list[Exception] = []
    with pytest.raises(NatsUnreachableError) as caught:
        await connect_once(settings, timeout_s=0.5, errors=errors)
    assert isinstance(caught.value, TransientNatsError)
    assert issubclass(NatsSecurityError, PermanentNatsError)
