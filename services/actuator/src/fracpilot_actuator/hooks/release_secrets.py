"""The chart's secrets made in the cluster: what the ``secretGeneration: job`` hook Jobs run.

``helm template`` cannot look up what an earlier install made, so a chart that generates its
secrets at render time renders different ones each time, and GitOps tools (Argo CD, Flux) see
a change on every sync. With ``secretGeneration: job`` the chart renders no secret material;
instead two hook Jobs run this module with the actuator's image:

- ``create`` (pre-install / pre-upgrade): the webhook's serving Secret (a CA and a certificate
  for the webhook Service's DNS names) unless one that is still good exists
  (:func:`~fracpilot_actuator.admission.certificates.renewal_reason`), and, when asked, the
  built-in NATS's user/password Secret unless it exists;
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
import sys
from collections.abc import Sequence

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


def ensure_password_secret(
    core: client.CoreV1Api, namespace: str, name: str, user_key: str, password_key: str
) -> str:
    """Make the NATS user/password Secret once; an existing one is never changed."""
    if _read_secret(core, namespace, name) is not None:
        return "kept"
    data = {user_key: b"fracpilot", password_key: secrets.token_urlsafe(24).encode()}
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=_MANAGED_BY),
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
