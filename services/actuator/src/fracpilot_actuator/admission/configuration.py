"""The MutatingWebhookConfiguration that registers the webhook, as a plain dict. Pure.

``failurePolicy: Ignore``, so that the webhook being down never blocks pod creation. Which pods
are sent is the opt-in rule (:func:`fracpilot_actuator.opt_in.webhook_selectors`): two webhooks
with the same service, one for the pods of opted-in namespaces, one for pods opted in by label.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fracpilot_actuator.opt_in import webhook_selectors

WEBHOOK_CONFIGURATION_NAME = "fracpilot-targets"
WEBHOOK_NAME = "targets.fracpilot.io"  # a webhook's name must be fully qualified
MUTATE_PATH = "/mutate"


@dataclass(frozen=True)
class ServiceReference:
    """The in-cluster Service in front of the webhook (clientConfig.service)."""

    namespace: str
    name: str
    port: int = 443
    path: str = MUTATE_PATH


def webhook_configuration(
    *,
    ca_bundle: bytes,
    url: str | None = None,
    service: ServiceReference | None = None,
    name: str = WEBHOOK_CONFIGURATION_NAME,
    excluded_namespaces: Iterable[str] = ("kube-system",),
    timeout_seconds: int = 5,
    default_mode: str = "recommend",
) -> dict[str, Any]:
    """The ``admissionregistration.k8s.io/v1`` MutatingWebhookConfiguration, as a plain dict.

    ``ca_bundle`` is the PEM of the CA that signed the serving certificate. Exactly one of
    ``url`` (``https://host:port/mutate``) and ``service`` says where the webhook is. Only
    pods whose opt-in answer is auto are sent (``default_mode``: that of namespaces without the
    label ``fracpilot.io/mode``); never those in ``excluded_namespaces`` or opted out;
    ``failurePolicy: Ignore`` admits pods when the webhook fails.
    """
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    if not 1 <= timeout_seconds <= 30:
        raise ValueError("timeoutSeconds must be between 1 and 30")
    client_config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode()}
    if url is not None:
        if not url.startswith("https://"):
            raise ValueError("a webhook url must be https")
        client_config["url"] = url
    elif service is not None:
        client_config["service"] = {
            "namespace": service.namespace,
            "name": service.name,
            "port": service.port,
            "path": service.path,
        }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fracpilot"}},
        "webhooks": [
            {
                "name": selector.name_prefix + WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": dict(client_config),
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
                # Re-run after a later webhook changed the pod; the patch is idempotent.
                "reinvocationPolicy": "IfNeeded",
                "namespaceSelector": {"matchExpressions": selector.namespace},
                "objectSelector": {"matchExpressions": selector.pod},
            }
            for selector in webhook_selectors(default_mode, excluded_namespaces)
        ],
    }
