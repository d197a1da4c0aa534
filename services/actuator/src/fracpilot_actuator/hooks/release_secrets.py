"""The chart's secrets made in the cluster: what the ``secretGeneration: job`` hook Jobs run.

``helm template`` cannot look up what an earlier install made, so a chart that generates its
secrets at render time renders different ones each time, and GitOps tools (Argo CD, Flux) see
a change on every sync. With ``secretGeneration: job`` the chart renders no secret material;
instead two hook Jobs run this module with the actuator's image:

- ``create`` (pre-install / pre-upgrade): the webhook's serving Secret (a CA and a certificate
  for the webhook Service's DNS names) unless one that is still good exists
  (:func:`~fracpilot_actuator.admission.certificates.renewal_reason`), and, when asked, the
  NATS Secrets: one user/password Secret per identity (or the one shared identity's) unless it
  exists, and the built-in NATS's certificate (a CA of its own) with a CA-only Secret for the
  clients, renewed like the webhook's;
- ``inject-ca`` (post-install / post-upgrade, once the MutatingWebhookConfiguration exists):
  writes the Secret's ``ca.crt`` into every webhook of that configuration as its ``caBundle``.

Both are idempotent: running them again changes nothing that is still good.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import logging
import secrets
import string
import sys
from collections.abc import Mapping, Sequence

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fracpilot_actuator.admission.certificates import issue_serving_bundle, renewal_reason
from fracpilot_libs.kube.client import make_api_client
from fracpilot_libs.telemetry import setup_logging

log = logging.getLogger(__name__)

_MANAGED_BY = {"app.kubernetes.io/managed-by": "fracpilot-release-secrets"}


def _decoded(secret: client.V1Secret | None) -> dict[str, bytes]:
    if secret is None or not secret.data:
        return {}
    return {k: base64.b64decode(v) for k, v in secret.data.items()}


def _encoded(data: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in data.items()}


def _read_secret(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Secret | None:
    try:
        secret: client.V1Secret = core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return secret


def ensure_webhook_secret(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    dns_names: list[str],
    now: dt.datetime,
    validity: dt.timedelta,
    renew_before: dt.timedelta,
) -> str:
    """Make or renew the serving Secret when needed; returns what was done."""
    existing = _read_secret(core, namespace, name)
    reason = renewal_reason(_decoded(existing), dns_names, now, renew_before)
    if reason is None:
        log.info("webhook secret still good", extra={"secret": name})
        return "kept"
    bundle = issue_serving_bundle(f"{name}-ca", dns_names, now, validity)
    metadata = client.V1ObjectMeta(name=name, namespace=namespace, labels=_MANAGED_BY)
    body = client.V1Secret(
        metadata=metadata, type="kubernetes.io/tls", data=_encoded(bundle.as_secret_data())
    )
    if existing is None:
        core.create_namespaced_secret(namespace, body)
        action = "created"
    else:  # replace with the read version: a concurrent change makes this fail, not vanish
        metadata.resource_version = (existing.metadata or client.V1ObjectMeta()).resource_version
        core.replace_namespaced_secret(name, namespace, body)
        action = "renewed"
    log.info("webhook secret %s", action, extra={"secret": name, "reason": reason})
    return action


def new_password() -> str:
    """32 random letters and digits, a letter first: nats-server reads the passwords from its
    environment and parses them, so one must never look like a number."""
    alphabet = string.ascii_letters + string.digits
    return secrets.choice(string.ascii_letters) + "".join(
        secrets.choice(alphabet) for _ in range(31)
    )


def password_secret_data(user: str, user_key: str, password_key: str) -> dict[str, bytes]:
    """A user/password Secret's data, with a new password."""
    return {user_key: user.encode(), password_key: new_password().encode()}


def nats_tls_secret_data(
    ca_name: str, dns_names: list[str], now: dt.datetime, validity: dt.timedelta
) -> dict[str, bytes]:
    """The built-in NATS's ``kubernetes.io/tls`` data: a new CA and a certificate for
    ``dns_names`` and 127.0.0.1 (the CLI's port-forward), for server and client auth (the
    routes between the servers are mutual TLS with the same certificate)."""
    bundle = issue_serving_bundle(
        ca_name, dns_names, now, validity, ip_addresses=["127.0.0.1"], client_auth=True
    )
    return bundle.as_secret_data()


def ensure_password_secret(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    user_key: str,
    password_key: str,
    user: str = "fracpilot",
    labels: Mapping[str, str] | None = None,
) -> str:
    """Make a NATS user/password Secret once; an existing one is never changed."""
    if _read_secret(core, namespace, name) is not None:
        return "kept"
    data = password_secret_data(user, user_key, password_key)
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, labels={**_MANAGED_BY, **(labels or {})}
        ),
        type="Opaque",
        data=_encoded(data),
    )
    try:
        core.create_namespaced_secret(namespace, body)
    except ApiException as exc:
        if exc.status == 409:  # made by a concurrent run: keep that one
            return "kept"
        raise
    log.info("nats password secret created", extra={"secret": name})
    return "created"


def ensure_nats_tls_secrets(
    core: client.CoreV1Api,
    namespace: str,
    server_secret: str,
    ca_secret: str,
    dns_names: list[str],
    now: dt.datetime,
    validity: dt.timedelta,
    renew_before: dt.timedelta,
) -> str:
    """The built-in NATS's certificate (:func:`nats_tls_secret_data`), made or renewed as the
    webhook's; then the CA alone in ``ca_secret``, which the clients read."""
    existing = _read_secret(core, namespace, server_secret)
    reason = renewal_reason(_decoded(existing), dns_names, now, renew_before)
    action = "kept"
    if reason is not None:
        data = nats_tls_secret_data(f"{server_secret}-ca", dns_names, now, validity)
        _write(core, namespace, server_secret, "kubernetes.io/tls", data)
        action = "created" if existing is None else "renewed"
        log.info("nats tls secret %s", action, extra={"secret": server_secret, "reason": reason})
    ca = _decoded(_read_secret(core, namespace, server_secret))["ca.crt"]
    if _decoded(_read_secret(core, namespace, ca_secret)) != {"ca.crt": ca}:
        _write(core, namespace, ca_secret, "Opaque", {"ca.crt": ca})
    return action


def _write(
    core: client.CoreV1Api, namespace: str, name: str, kind: str, data: dict[str, bytes]
) -> None:
    """Create the Secret, or replace the version read just now (a concurrent change fails)."""
    metadata = client.V1ObjectMeta(name=name, namespace=namespace, labels=_MANAGED_BY)
    body = client.V1Secret(metadata=metadata, type=kind, data=_encoded(data))
    existing = _read_secret(core, namespace, name)
    if existing is None:
        core.create_namespaced_secret(namespace, body)
        return
    metadata.resource_version = (existing.metadata or client.V1ObjectMeta()).resource_version
    core.replace_namespaced_secret(name, namespace, body)


def inject_ca_bundle(
    core: client.CoreV1Api,
    admission: client.AdmissionregistrationV1Api,
    namespace: str,
    secret_name: str,
    configuration: str,
) -> int:
    """Write the Secret's CA into each webhook of ``configuration``; returns how many changed."""
    data = _decoded(_read_secret(core, namespace, secret_name))
    ca = data.get("ca.crt")
    if not ca:
        raise RuntimeError(f"secret {namespace}/{secret_name} has no ca.crt: run `create` first")
    wanted = base64.b64encode(ca).decode()
    current = admission.read_mutating_webhook_configuration(configuration)
    patch = []
    for i, hook in enumerate(current.webhooks or []):
        if hook.client_config.ca_bundle != wanted:
            patch.append(
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted}
            )
    if patch:
        admission.patch_mutating_webhook_configuration(configuration, patch)
    log.info(
        "webhook caBundle injected", extra={"configuration": configuration, "changed": len(patch)}
    )
    return len(patch)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fracpilot_actuator.hooks.release_secrets")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--kubeconfig", default=None, help="default: the pod's ServiceAccount")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="make or renew the secrets")
    create.add_argument("--webhook-secret", default="", help="make or renew this TLS Secret")
    create.add_argument("--dns-name", action="append", default=[], dest="dns_names")
    create.add_argument("--validity-days", type=int, default=3650)
    create.add_argument("--renew-before-days", type=int, default=30)
    create.add_argument("--nats-secret", default="", help="also make this user/password Secret")
    create.add_argument("--nats-user-key", default="user")
    create.add_argument("--nats-password-key", default="password")
    create.add_argument(
        "--nats-identity",
        action="append",
        default=[],
        dest="nats_identities",
        metavar="IDENTITY=SECRET",
        help="also make this identity's user/password Secret (user: the identity)",
    )
    create.add_argument("--nats-tls-secret", default="", help="the built-in NATS's certificate")
    create.add_argument("--nats-ca-secret", default="", help="its CA alone, for the clients")
    create.add_argument("--nats-dns-name", action="append", default=[], dest="nats_dns_names")
    create.add_argument("--nats-validity-days", type=int, default=3650)
    inject = sub.add_parser("inject-ca", help="write the CA into the webhook configuration")
    inject.add_argument("--webhook-secret", required=True)
    inject.add_argument("--configuration", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging("release-secrets")
    return run(sys.argv[1:] if argv is None else argv)


def run(argv: Sequence[str]) -> int:
    """What the Job runs, for these arguments: 0 done, 1 failed (the reason is logged)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "create" and args.webhook_secret and not args.dns_names:
        parser.error("--webhook-secret needs at least one --dns-name")
    if args.command == "create":
        if args.nats_tls_secret and not (args.nats_ca_secret and args.nats_dns_names):
            parser.error("--nats-tls-secret needs --nats-ca-secret and --nats-dns-name")
        if any("=" not in i for i in args.nats_identities):
            parser.error("--nats-identity takes IDENTITY=SECRET")
    api = make_api_client(args.kubeconfig)
    core = client.CoreV1Api(api)
    try:
        if args.command == "create" and args.webhook_secret:
            ensure_webhook_secret(
                core,
                args.namespace,
                args.webhook_secret,
                args.dns_names,
                dt.datetime.now(dt.UTC),
                dt.timedelta(days=args.validity_days),
                dt.timedelta(days=args.renew_before_days),
            )
        if args.command == "create":
            if args.nats_secret:
                ensure_password_secret(
                    core,
                    args.namespace,
                    args.nats_secret,
                    args.nats_user_key,
                    args.nats_password_key,
                )
            for identity, _, name in (i.partition("=") for i in args.nats_identities):
                ensure_password_secret(
                    core,
                    args.namespace,
                    name,
                    args.nats_user_key,
                    args.nats_password_key,
                    user=identity,
                    labels={"fracpilot.io/nats-identity": identity},
                )
            if args.nats_tls_secret:
                ensure_nats_tls_secrets(
                    core,
                    args.namespace,
                    args.nats_tls_secret,
                    args.nats_ca_secret,
                    args.nats_dns_names,
                    dt.datetime.now(dt.UTC),
                    dt.timedelta(days=args.nats_validity_days),
                    dt.timedelta(days=args.renew_before_days),
                )
        else:
            inject_ca_bundle(
                core,
                client.AdmissionregistrationV1Api(api),
                args.namespace,
                args.webhook_secret,
                args.configuration,
            )
    except (ApiException, RuntimeError) as exc:
        log.error("release secrets failed", extra={"error": str(exc)})
        return 1
    finally:
        api.close()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    sys.exit(main())
