"""Issue 26: a result is what was verified (each test fails on the code before it).

The backend runs on the recording API of test_backend.py, which keeps its pods: a patch
changes them (and honours the precondition it carries), an eviction removes the pod; a test
adds the replacement a ReplicaSet would make.
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.kube.errors import PermanentKubeError, TransientKubeError
from fracpilot_actuator.kube.scale_ups import stuck_scaling_pod
from fracpilot_actuator.settings import CapacitySettings, EvictionSettings
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind
from support.kube_objects import kai, node, reservation
from support.recording_kube import NOW, OWNER, UUID_A, RecordingApi, backend_for, grow

ACTUATOR = Path(__file__).resolve().parents[4] / "services" / "actuator" / "src"
UUID_B = "GPU-11111111-2222-3333-4444-555555555555"


def two_chats(fraction: str = "0.25") -> RecordingApi:
    pods = [kai(f"chat-{i}", fraction, group="g1", owner=OWNER) for i in range(2)]
    return RecordingApi([node("n1", gpus=1)], [reservation("g1", UUID_A), *pods])


def test_an_in_place_patch_is_conditional_on_the_pod_as_read_and_read_back() -> None:
    api = two_chats()
    backend, *_ = backend_for(api)
    result = asyncio.run(backend.actuate(grow(0.25, 0.38), dry_run="", now=NOW))
    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED)
    assert api.preconditions == [("1", "uid-chat-0"), ("1", "uid-chat-1")]
    assert "resized in place and read back" in result.detail


def test_an_in_place_conflict_reads_again_and_judges_once_more() -> None:
    api = two_chats()
    api.changed_behind_our_back = 1  # someone writes chat-0 between our read and our patch
    backend, *_ = backend_for(api)
    result = asyncio.run(backend.actuate(grow(0.25, 0.38), dry_run="", now=NOW))
    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), result
    assert result.detail.startswith("inference/chat-0 changed since it was read")
    # the second judgement patched chat-0 at its new resourceVersion
    assert api.preconditions[:2] == [("1", "uid-chat-0"), ("2", "uid-chat-0")]


def test_a_second_conflict_is_a_failed_result() -> None:
    api = two_chats()
    api.changed_behind_our_back = 2
    backend, *_ = backend_for(api)
    result = asyncio.run(backend.actuate(grow(0.25, 0.38), dry_run="", now=NOW))
    assert result.outcome is Outcome.FAILED
    assert "changed since it was read" in (result.error or "")
    assert not backend.guards.in_flight


def test_an_api_rejection_of_the_patch_is_a_failed_result_with_its_reason() -> None:
    api = two_chats()
    api.refuse_patches = PermanentKubeError(
        "(422)", status=422, message='admission webhook "admission.run.ai" denied the request'
    )
    backend, *_ = backend_for(api)
    result = asyncio.run(backend.actuate(grow(0.25, 0.38), dry_run="", now=NOW))
    assert result.outcome is Outcome.FAILED
    assert "refused (422)" in (result.error or "")
    assert "denied the request" in (result.error or "")


def recreate_setup(**settings: Any) -> tuple[RecordingApi, Any, list[Actuation]]:
    """chat-0 and chat-1 at 0.5 on n1's one GPU, an empty n2: 0.75 means a recreate."""
    pods = [kai(f"chat-{i}", "0.5", group="g1", owner=OWNER) for i in range(2)]
    api = RecordingApi([node("n1", gpus=1), node("n2", gpus=1)], [reservation("g1", UUID_A), *pods])
    reported: list[Actuation] = []
    backend, *_ = backend_for(
        api, guardrails=GuardrailSettings(allow_single_replica=True), **settings
    )

    async def report(_decision: FractionDecision, actuation: Actuation) -> None:
        reported.append(actuation)

    backend.report = report
    backend.scale_ups.backend = backend
    return api, backend, reported


def replacement(api: RecordingApi, fraction: str, node_name: str | None = "n2") -> None:
    """The ReplicaSet's new pod, as fracpilot's webhook (or nobody) sized it, bound by KAI."""
    api.pods.append(reservation("g2", UUID_B, node_name="n2"))
    new = kai("chat-0-new", fraction, group="g2", owner=OWNER, node_name=node_name)
    new["metadata"]["creationTimestamp"] = (NOW + timedelta(seconds=5)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    api.pods.append(new)


def test_a_recreate_is_pending_until_the_replacement_is_bound_and_reports_what_it_holds() -> None:
    api, backend, reported = recreate_setup()
    made = grow(0.5, 0.75)
    first = asyncio.run(backend.actuate(made, dry_run="", now=NOW))
    assert (first.plan, first.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
    assert (first.node_after, first.fraction_after) == ("", 0.5)  # nothing moved yet
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=1)))
    assert reported == []  # no replacement yet
    replacement(api, "0.75")
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=10)))
    [done] = reported
    assert (done.outcome, done.stage) == (Outcome.APPLIED, "verified")
    assert (done.node_after, done.gpu_after, done.fraction_after) == ("n2", UUID_B, 0.75)
    assert not backend.recreates
    assert not backend.guards.in_flight


def test_a_replacement_born_at_the_wrong_share_is_reported_as_it_is_then_corrected() -> None:
    api, backend, reported = recreate_setup()
    backend.settings = type(backend.settings)(
        **{
            **backend.settings.__dict__,
            "guardrails": GuardrailSettings(allow_single_replica=True, max_disruptions=1),
        }
    )
    made = grow(0.5, 0.75)
    asyncio.run(backend.actuate(made, dry_run="", now=NOW))
    replacement(api, "0.5")  # fracpilot's webhook was down: the template's share
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=10)))
    wrong, correction = reported
    assert (wrong.outcome, wrong.fraction_after, wrong.node_after) == (Outcome.FAILED, 0.5, "n2")
    assert "born with 0.5, not 0.75" in (wrong.error or "")
    # KAI without HAMi-core: the correction is in place (no disruption: the budget, one
    # disruption, spent by the recreate, allows it); a recreate would be left as advice.
    assert (correction.plan, correction.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED)
    assert correction.stage == "correction-1"
    assert api.pods[-1]["metadata"]["annotations"]["gpu-fraction"] == "0.75"


def test_a_replacement_never_bound_fails_after_the_timeout() -> None:
    api, backend, reported = recreate_setup(verify_timeout_s=60)
    asyncio.run(backend.actuate(grow(0.5, 0.75), dry_run="", now=NOW))
    replacement(api, "0.75", node_name=None)
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=61)))
    [failed] = reported
    assert failed.outcome is Outcome.FAILED
    assert "0 of 1 replacement(s) bound within 60 s" in (failed.error or "")


def test_an_eviction_a_pdb_refuses_uses_none_of_the_budget() -> None:
    api, backend, _ = recreate_setup(eviction=EvictionSettings(attempts=1))
    api.refuse_evictions = True
    api.refusal = TransientKubeError("(429)", status=429, message="violates the PDB")
    result = asyncio.run(backend.actuate(grow(0.5, 0.75), dry_run="", now=NOW))
    assert result.outcome is Outcome.FAILED
    assert backend.guards.recent == ()
    assert "used none of the budget" in result.detail


def test_the_placeholder_settings_default_safely_beside_the_autoscaler() -> None:
    s = CapacitySettings()
    assert s.priority > -10  # the autoscaler's expendable-pods-priority-cutoff
    assert s.timeout_s > 15 * 60  # its max-node-provision-time
    with pytest.raises(ValidationError, match="expendable"):
        CapacitySettings(priority=-10)
    with pytest.raises(ValidationError, match="max-node-provision-time"):
        CapacitySettings(timeout_s=900)


def test_a_scaling_pod_bound_but_marked_unschedulable_is_stuck() -> None:
    stuck = {
        "spec": {"nodeName": "n2"},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False"}]},
    }
    waiting = {"spec": {}, "status": stuck["status"]}
    fine = {
        "spec": {"nodeName": "n2"},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    assert [stuck_scaling_pod(p) for p in (stuck, waiting, fine)] == [True, False, False]


def test_the_backend_and_its_follow_ups_never_read_the_clock() -> None:
    for name in ("backend.py", "scale_ups.py", "verification.py"):
        text = (ACTUATOR / "fracpilot_actuator" / "kube" / name).read_text()
        assert not re.search(r"datetime\.now|utcnow\(", text), name
