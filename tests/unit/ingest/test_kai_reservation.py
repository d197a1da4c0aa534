"""Ingest finds KAI's reservation pods where the binder's flags put them, read from the same
``FRACPILOT_KAI_RESERVATION_*`` variables as the actuator."""

from __future__ import annotations

from typing import Any

import pytest

from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_ingest.pod_facts import kai_shared_gpus, pod_projection
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.kai import KaiReservation

GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
MOVED = KaiReservation("kai-res", "res")


def pod(namespace: str, name: str, labels: dict[str, str], notes: dict[str, str]) -> Any:
    return {
        "metadata": {"namespace": namespace, "name": name, "labels": labels, "annotations": notes},
        "status": {"phase": "Running"},
    }


def reservation(namespace: str, app: str, gpu: str = GPU) -> Any:
    return pod(
        namespace,
        f"gpu-reservation-{namespace}",
        {"runai-gpu-group": "g1", "app": app},
        {"run.ai/reserve_for_gpu_index": gpu},
    )


CHAT = pod("team-a", "chat-0", {"runai-gpu-group": "g1", "app": "chat"}, {"gpu-fraction": "0.5"})


def test_settings_default_to_kais_and_read_the_actuators_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert IngestSettings().kai.reservation == KaiReservation(
        "kai-resource-reservation", "kai-resource-reservation"
    )
    monkeypatch.setenv("FRACPILOT_KAI_RESERVATION_NAMESPACE", "kai-res")
    monkeypatch.setenv("FRACPILOT_KAI_RESERVATION_APP_LABEL", "res")
    assert IngestSettings().kai.reservation == MOVED
    actuator = ActuatorSettings().kai
    assert (actuator.reservation_namespace, actuator.reservation_app_label) == ("kai-res", "res")


def test_only_the_configured_reservation_pods_name_a_groups_gpu() -> None:
    default = reservation("kai-resource-reservation", "kai-resource-reservation")
    moved = reservation("kai-res", "res", gpu="GPU-moved")
    # The projected pods (what the pods cache keeps) still tell a reservation pod.
    pods = [pod_projection(p) for p in (default, moved, CHAT)]
    assert kai_shared_gpus(pods) == {GPU: {("team-a", "chat-0"): 0.5}}
    assert kai_shared_gpus(pods, reservation=MOVED) == {"GPU-moved": {("team-a", "chat-0"): 0.5}}


def test_a_pod_carrying_the_annotation_elsewhere_names_no_gpu() -> None:
    wrong_namespace = reservation("team-a", "kai-resource-reservation")
    wrong_label = reservation("kai-resource-reservation", "other")
    assert kai_shared_gpus([wrong_namespace, CHAT]) == {}
    assert kai_shared_gpus([wrong_label, CHAT]) == {}
