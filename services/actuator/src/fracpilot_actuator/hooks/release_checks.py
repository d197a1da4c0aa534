"""What ``helm test`` runs: three checks that an installed release works, from inside it.

Each check is a function returning a problem (None: fine), so the tests run the same code
against real servers that the chart's test pods run in a cluster
(``python -m fracpilot_actuator.hooks.release_checks <check>``, the actuator's image):

- ``webhook``: the webhook answers over TLS and its certificate verifies against the
  ``caBundle`` the apiserver uses *now* (read from the MutatingWebhookConfiguration), for the
  Service's DNS name: a stale CA after a certificate change fails here, not at the next pod;
- ``nats``: the release's NATS accepts the services' identity and has JetStream;
- ``policy``: a policy set through the decision service comes back from it (NATS, the
  decision service and its KV bucket in one round trip). It writes a recommend-only policy for
  a workload that does not exist (``<namespace>/fracpilot-helm-test``), which changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import ssl
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

import aiohttp
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Mode, Policy, PolicyLevel, PolicyReply, PolicyScope
from fracpilot_libs.kube.client import make_api_client
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.connect import connect_once
from fracpilot_libs.nats.decoding import DecodeError, decode
from fracpilot_libs.nats.errors import PermanentNatsError, TransientNatsError
from fracpilot_libs.telemetry import setup_logging

log = logging.getLogger(__name__)

TEST_WORKLOAD = "fracpilot-helm-test"


def current_ca_bundle(admission: client.AdmissionregistrationV1Api, configuration: str) -> bytes:
    """The PEM CA the apiserver trusts for the configuration's first webhook."""
    hooks = admission.read_mutating_webhook_configuration(configuration).webhooks or []
    if not hooks or not hooks[0].client_config.ca_bundle:
        raise ValueError(f"{configuration} has no caBundle")
    return base64.b64decode(hooks[0].client_config.ca_bundle)


async def check_webhook(url: str, ca_pem: bytes, connect_to: str | None = None) -> str | None:
    """GET ``url``/healthz verifying the certificate with ``ca_pem`` for ``url``'s host name.

    ``connect_to`` (``host:port``) dials another address while verifying the URL's name.
    """
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        return f"not an https URL: {url}"
    dial = connect_to or parts.netloc
    context = ssl.create_default_context(cadata=ca_pem.decode())
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20, connect=10)) as session,
            session.get(
                f"https://{dial}/healthz",
                ssl=context,
                server_hostname=parts.hostname,  # verified against the URL's name, not dial's
                headers={"Host": parts.netloc},
            ) as response,
        ):
            status, body = response.status, await response.text(errors="replace")
    except aiohttp.ClientConnectorCertificateError as exc:
        return f"the webhook's certificate does not verify against the current caBundle: {exc}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"cannot reach the webhook at {dial}, or it did not answer: {exc}"
    if status != 200:
        return f"the webhook's /healthz answered {status}: {body[:200]!r}"
    return None


async def check_nats(settings: ServiceSettings) -> str | None:
    """Connect as the services do and ask JetStream for the account's state."""
    try:
        nc = await connect_once(settings, timeout_s=10.0, name="fracpilot-release-check")
    except (PermanentNatsError, TransientNatsError) as exc:
        return f"cannot connect to NATS at {settings.nats.url}: {exc}"
    try:
        info = await nc.jetstream().account_info()
    except Exception as exc:  # any JetStream failure is the answer to report
        return f"NATS is up but JetStream does not answer: {exc}"
    finally:
        await nc.close()
    log.info("nats reachable", extra={"streams": info.streams, "consumers": info.consumers})
    return None


async def check_policy_round_trip(settings: ServiceSettings, namespace: str) -> str | None:
    """Set a recommend-only policy for a workload that does not exist, and read it back."""
    scope = PolicyScope(level=PolicyLevel.WORKLOAD, namespace=namespace, workload=TEST_WORKLOAD)
    policy = Policy(scope=scope, mode=Mode.RECOMMEND)
    try:
        nc = await connect_once(settings, timeout_s=10.0, name="fracpilot-release-check")
    except (PermanentNatsError, TransientNatsError) as exc:
        return f"cannot connect to NATS at {settings.nats.url}: {exc}"
    try:
        set_msg = await nc.request(subjects.POLICY_SET, policy.to_json(), timeout=10.0)
        stored = decode(PolicyReply, set_msg.data)
        got_msg = await nc.request(subjects.POLICY_GET, scope.to_json(), timeout=10.0)
        got = decode(PolicyReply, got_msg.data)
    except DecodeError as exc:
        return f"the decision service answered something that is not a policy reply: {exc}"
    except Exception as exc:  # no responders, timeouts: the answer to report
        return f"no policy round trip through the decision service: {exc!r}"
    finally:
        await nc.close()
    if not stored.ok or stored.policy is None:
        return f"the decision service refused the policy: {stored.error}"
    if not got.ok or got.policy is None or got.policy.revision != stored.policy.revision:
        return f"the policy read back is not the one stored: {got.model_dump_json()}"
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fracpilot_actuator.hooks.release_checks")
    sub = parser.add_subparsers(dest="check", required=True)
    webhook = sub.add_parser("webhook")
    webhook.add_argument("--configuration", required=True, help="MutatingWebhookConfiguration")
    webhook.add_argument("--url", required=True, help="https://<service>.<namespace>.svc:443")
    webhook.add_argument("--connect-to", default=None, help="host:port to dial instead")
    webhook.add_argument("--kubeconfig", default=None)
    sub.add_parser("nats")
    policy = sub.add_parser("policy")
    policy.add_argument("--namespace", required=True)
    return parser


async def run_check(argv: Sequence[str]) -> str | None:
    """Parse ``argv`` as the test pods pass it and run that check: its problem, or None."""
    args = _parser().parse_args(argv)
    if args.check == "webhook":
        api = make_api_client(args.kubeconfig)
        try:
            ca = current_ca_bundle(client.AdmissionregistrationV1Api(api), args.configuration)
        except (ApiException, ValueError) as exc:
            return f"cannot read the webhook's caBundle: {exc}"
        finally:
            api.close()  # type: ignore[no-untyped-call]
        return await check_webhook(args.url, ca, args.connect_to)
    settings = ServiceSettings()  # the services' FRACPILOT_NATS_* identity, as the chart sets it
    if args.check == "nats":
        return await check_nats(settings)
    return await check_policy_round_trip(settings, args.namespace)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging("release-checks")
    problem = asyncio.run(run_check(argv))
    if problem is not None:
        log.error("release check failed", extra={"check": argv[0], "problem": problem})
        return 1
    log.info("release check passed", extra={"check": argv[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
