"""An AdmissionReview as the kube-apiserver sends the webhook for a new pod, for the tests that
talk to the webhook server over HTTPS (tests/integration/k8s/test_webhook.py,
tests/integration/test_fuzz_webhook.py)."""

from __future__ import annotations

from typing import Any

from fracpilot_actuator.admission import KAI_FRACTION

POD_TEMPLATE_HASH = "6b7f9c5d8"


def chat_pod_review(uid: str) -> dict[str, Any]:
    """A Pod CREATE in namespace inference of a pod of Deployment chat (through its ReplicaSet
    ``chat-<hash>``), asking KAI for half a GPU."""
    pod = {
        "metadata": {
            "generateName": f"chat-{POD_TEMPLATE_HASH}-",
            "labels": {"pod-template-hash": POD_TEMPLATE_HASH},
            "annotations": {KAI_FRACTION: "0.5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"chat-{POD_TEMPLATE_HASH}",
                    "uid": "x",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "server", "image": "x"}]},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "inference",
            "operation": "CREATE",
            "object": pod,
        },
    }
