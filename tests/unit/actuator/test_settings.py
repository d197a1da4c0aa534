"""The actuator's grouped settings keep their flat environment names."""

from __future__ import annotations

import pytest

from fracpilot_actuator.settings import ActuatorSettings


def test_groups_read_the_flat_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "FRACPILOT_KUBE_TIMEOUT_S": "7",
        "FRACPILOT_KUBE_RETRY_ATTEMPTS": "3",
        "FRACPILOT_EVICTION_ATTEMPTS": "2",
        "FRACPILOT_EVICTION_BACKOFF_MAX_S": "9",
        "FRACPILOT_CAPACITY_POLL_S": "1.5",
        "FRACPILOT_CAPACITY_NAMESPACE": "capacity",
        "FRACPILOT_LEASE_RENEW_DEADLINE_S": "8",
        "FRACPILOT_WEBHOOK_ENABLED": "true",
        "FRACPILOT_WEBHOOK_PORT": "9443",
        "FRACPILOT_SIM_PODS": "inference/chat=0.5",
        "FRACPILOT_SIM_GPUS_PER_NODE": "4",
        "FRACPILOT_MAX_DISRUPTIONS_PER_NAMESPACE": "3",
        "FRACPILOT_DISRUPTION_WINDOW_S": "60",
        "FRACPILOT_KUBECONFIG": "/tmp/kubeconfig",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s = ActuatorSettings()
    assert (s.kube.timeout_s, s.kube.retry_attempts, s.kube.retry_backoff_s) == (7, 3, 0.2)
    assert (s.eviction.attempts, s.eviction.backoff_s, s.eviction.backoff_max_s) == (2, 1.0, 9)
    assert (s.capacity.poll_s, s.capacity.namespace, s.capacity.timeout_s) == (
        1.5,
        "capacity",
        1200,
    )
    assert (s.lease.renew_deadline_s, s.lease.duration_s) == (8, 15)
    assert (s.webhook.enabled, s.webhook.port, s.webhook.host) == (True, 9443, "0.0.0.0")
    assert (s.sim.pods, s.sim.gpus_per_node, s.sim.cluster) == ("inference/chat=0.5", 4, "demo")
    assert s.kubeconfig == "/tmp/kubeconfig"
    assert s.guardrails.max_disruptions_per_namespace == 3
    assert s.guardrails.window_s == 60


def test_groups_can_be_given_in_code() -> None:
    s = ActuatorSettings(sim={"pods": "a/b=0.5"}, capacity={"poll_s": 0.2})  # type: ignore[arg-type]
    assert (s.sim.pods, s.sim.nodes, s.capacity.poll_s) == ("a/b=0.5", 2, 0.2)
