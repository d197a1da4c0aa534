"""Issue 26, "with fracpilot's webhook down, the replacement's real fraction is what the result
says", on the real KAI stack.

fracpilot's admission webhook is registered with ``failurePolicy: Ignore``. Pointed at a port
nothing listens on, the apiserver admits the ReplicaSet's new pod as its template says (0.5),
and KAI binds it so. The recreate's results must say 0.5 (FAILED "born with 0.5, not 0.75",
read from the new pod), and the correction that follows (within a disruption budget of one:
in place when the pod landed alone on a GPU, else left as a recommendation) claims 0.75 only
if the pod really holds it.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from fracpilot_actuator.admission import TARGET_ANNOTATION
from fracpilot_actuator.app import ActuatorService
from fracpilot_libs.contracts import Outcome, PlanKind
from fracpilot_libs.server_process import free_port
from support.fracpilot_on_stack import (
    KaiScenario,
    apply,
    chat_and_other_sharing_a_gpu,
    decide,
    in_thread,
    kai_pod_body,
    running_pods,
    wait_replacement,
)
from support.gpu_stack import GPU_FRACTION, GpuStack

pytestmark = pytest.mark.integration


def admissions(service: ActuatorService) -> float:
    total = 0.0
    for metric in service.runtime.registry.collect():
        if metric.name == "fracpilot_webhook_admissions":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


def webhook_down(stack: GpuStack, service: ActuatorService, namespace: str) -> None:
    """Point fracpilot's webhook configuration at a dead port, and wait until the apiserver
    admits a (dry-run) pod without calling fracpilot's webhook: it ignores the failure."""
    admission = client.AdmissionregistrationV1Api(stack.api)
    name = f"fracpilot-targets-{namespace}"
    config = admission.read_mutating_webhook_configuration(name)
    for hook in config.webhooks:
        hook.client_config.url = f"https://127.0.0.1:{free_port()}/mutate"
    admission.replace_mutating_webhook_configuration(name, config)
    core = client.CoreV1Api(stack.api)

    def ignored() -> bool | None:
        before = admissions(service)
        probe = kai_pod_body("webhook-probe", "0.1")
        core.create_namespaced_pod(namespace, probe, dry_run="All")  # type: ignore[arg-type]
        return True if admissions(service) == before else None

    stack.wait(ignored, "the apiserver to skip fracpilot's unreachable webhook", timeout=30)


@pytest.mark.timeout(300)
async def test_with_the_webhook_down_the_results_say_the_replacements_real_fraction(
    kai: KaiScenario,
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    full = await kai.add_gpu_node()
    changes: dict[str, Any] = {"max_disruptions": 1, "verify": {"timeout_s": 120}}
    async with kai.actuator(**changes) as service:
        chat, _ = await chat_and_other_sharing_a_gpu(stack, ns)
        assert chat["spec"]["nodeName"] == full
        await kai.add_gpu_node()  # an empty GPU: where 0.75 fits
        await in_thread(webhook_down, stack, service, ns)

        made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.75)
        evicted, born, correction = await apply(nats_url, made, count=3, timeout=150)
        new = await wait_replacement(stack, ns, "chat", chat, "the recreated chat pod Running", 60)
        # Admitted without fracpilot: the template's share, no target annotation.
        assert TARGET_ANNOTATION not in new["metadata"]["annotations"]

        assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
        # The verified result is what the new pod holds, read from it.
        assert (born.outcome, born.fraction_after) == (Outcome.FAILED, 0.5), born
        assert "born with 0.5, not 0.75" in (born.error or "")
        assert born.node_after == new["spec"]["nodeName"]
        assert born.enforced_fraction in (None, 0.5)

        # The correction claims 0.75 only where the pod holds it.
        [now] = await in_thread(running_pods, stack, ns, "chat")
        held = float(now["metadata"]["annotations"][GPU_FRACTION])
        print(f"webhook down: born at 0.5; correction {correction.plan} {correction.outcome}")
        if correction.outcome is Outcome.APPLIED:
            assert correction.plan is PlanKind.IN_PLACE, correction
            assert (correction.fraction_after, held) == (0.75, 0.75)
            assert now["metadata"]["uid"] == new["metadata"]["uid"]  # resized, not recreated
        else:  # it would take a second eviction: the budget of one is spent
            assert correction.outcome is Outcome.DRY_RUN, correction
            assert "left as a recommendation" in correction.detail
            assert held == 0.5
        claims = [(r.outcome, r.fraction_after) for r in (evicted, born, correction)]
        assert (Outcome.APPLIED, 0.75) not in claims or held == 0.75, claims
