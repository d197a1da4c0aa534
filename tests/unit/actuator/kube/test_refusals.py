"""Issue 26: which FAILED results are refusals for good (the decision is dead-lettered) and which
may pass (a PDB's 429, a 5xx, a second 409: FAILED, nothing more).

The rule is :func:`fracpilot_actuator.kube.errors.refused_for_good`; the backend runs on the
recording API of tests/support/recording_kube.py. The handler's side (FAILED result, dead
letter, no redelivery) is in tests/integration/k8s/test_refusals_dead_lettered.py.
"""

from __future__ import annotations

import asyncio

import pytest

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.kube.errors import (
    PermanentKubeError,
    TransientKubeError,
    refused_for_good,
)
from fracpilot_actuator.kube.executor import StepFailure
from fracpilot_actuator.settings import EvictionSettings
from fracpilot_libs.contracts import Outcome, PlanKind
from support.kube_objects import hami, kai, node, reservation
from support.recording_kube import NOW, OWNER, UUID_A, RecordingApi, backend_for, grow


@pytest.mark.parametrize(
    ("status", "for_good"),
    [
        (400, True),  # an admission webhook's denial (KAI's gpu-fraction check)
        (401, True),
        (403, True),  # RBAC, or a webhook answering Forbidden
        (422, True),  # invalid, or a ValidatingAdmissionPolicy's denial
        (404, False),  # the object went: a fresh read plans otherwise
        (408, False),
        (409, False),  # a conflict: read again and judged again
        (410, False),
        (429, False),  # a PodDisruptionBudget allows no disruption now, or the server is busy
        (500, False),
        (503, False),
        (None, False),  # no answer
    ],
)
def test_a_refusal_is_for_good_only_for_a_4xx_that_says_never(
    status: int | None, for_good: bool
) -> None:
    assert refused_for_good(status) is for_good
    assert bool(StepFailure("x", status).refused) is for_good


def test_a_step_failure_is_its_text_and_keeps_the_status() -> None:
    failure = StepFailure("in-place resize refused (422): denied", 422)
    assert failure == "in-place resize refused (422): denied"
    assert (failure.status, failure.refused) == (422, "422")
    assert StepFailure("read back with nothing").refused == ""


def test_only_a_failed_actuation_with_a_refusal_is_permanent() -> None:
    failed = Actuation(PlanKind.IN_PLACE, Outcome.FAILED, "x", refused="403")
    assert failed.permanent
    assert not Actuation(PlanKind.IN_PLACE, Outcome.FAILED, "x").permanent
    assert not Actuation(PlanKind.IN_PLACE, Outcome.APPLIED, "x", refused="403").permanent


def two_kai_chats() -> RecordingApi:
    pods = [kai(f"chat-{i}", "0.25", group="g1", owner=OWNER) for i in range(2)]
    return RecordingApi([node("n1", gpus=1)], [reservation("g1", UUID_A), *pods])


def in_place(api: RecordingApi) -> Actuation:
    backend, *_ = backend_for(api)
    return asyncio.run(backend.actuate(grow(0.25, 0.38), dry_run="", now=NOW))


def test_a_patch_the_admission_refuses_is_refused_for_good_with_the_servers_reason() -> None:
    api = two_kai_chats()
    api.refuse_patches = PermanentKubeError(
        "(400)", status=400, message='admission webhook "kai.scheduler" denied the request'
    )
    result = in_place(api)
    assert (result.outcome, result.refused, result.permanent) == (Outcome.FAILED, "400", True)
    assert result.error == (
        "in-place resize of inference/chat-0 refused (400): "
        'admission webhook "kai.scheduler" denied the request'
    )
    assert type(result.error) is str  # what the result carries is plain text


def test_a_patch_of_a_pod_gone_meanwhile_is_failed_but_not_for_good() -> None:
    api = two_kai_chats()
    api.refuse_patches = PermanentKubeError("(404)", status=404, message='pods "chat-0" not found')
    result = in_place(api)
    assert (result.outcome, result.refused, result.permanent) == (Outcome.FAILED, "", False)
    assert "refused (404)" in (result.error or "")


def test_a_second_conflict_is_failed_but_not_for_good() -> None:
    api = two_kai_chats()
    api.changed_behind_our_back = 2
    result = in_place(api)
    assert result.outcome is Outcome.FAILED
    assert not result.permanent


def recreate(refusal: PermanentKubeError | TransientKubeError) -> Actuation:
    pods = [hami(f"chat-{i}", f"{UUID_A},NVIDIA,8192,0:;", owner=OWNER) for i in range(2)]
    api = RecordingApi([node("n1", gpus=1)], pods)
    api.refuse_evictions, api.refusal = True, refusal
    backend, *_ = backend_for(
        api,
        guardrails=GuardrailSettings(allow_single_replica=True),
        eviction=EvictionSettings(attempts=2, backoff_s=0.001, backoff_max_s=0.001),
    )
    result = asyncio.run(backend.actuate(grow(0.1, 0.2), dry_run="", now=NOW))
    assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.FAILED)
    return result


def test_an_eviction_rbac_refuses_is_refused_for_good() -> None:
    result = recreate(PermanentKubeError("(403)", status=403, message="forbidden"))
    assert (result.refused, result.permanent) == ("403", True)
    assert result.error == "eviction of inference/chat-0 failed (403): forbidden"


def test_an_eviction_a_pdb_refuses_is_failed_but_not_for_good() -> None:
    budget = "Cannot evict pod as it would violate the pod's disruption budget."
    result = recreate(TransientKubeError("(429)", status=429, message=budget))
    assert (result.refused, result.permanent) == ("", False)
    assert "refused 2 times (429" in (result.error or "")


def test_an_eviction_the_server_fails_is_failed_but_not_for_good() -> None:
    result = recreate(TransientKubeError("(503)", status=503, message="unavailable"))
    assert (result.refused, result.permanent) == ("", False)


def test_a_template_patch_refused_is_refused_for_good() -> None:
    api = two_kai_chats()
    backend, *_ = backend_for(api, targets_via="template")

    async def refuse(*_args: object) -> None:
        raise PermanentKubeError("(403)", status=403, message="deployments is forbidden")

    api.patch_pod_template = refuse  # type: ignore[attr-defined]
    owner = {
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "inference"},
        "spec": {
            "template": {
                "metadata": {"annotations": {"gpu-fraction": "0.25"}},
                "spec": {"containers": [{"name": "main", "image": "x"}]},
            }
        },
    }

    async def read_owner(*_args: object) -> dict[str, object]:
        return owner

    api.read_owner = read_owner  # type: ignore[method-assign]
    result = asyncio.run(backend.actuate(grow(0.25, 0.38), dry_run="", now=NOW))
    assert (result.outcome, result.refused) == (Outcome.FAILED, "403"), result
    assert "pod template patch of Deployment" in (result.error or "")
