"""The policy sync's pure part: an object read as a Policy, and the plan of one pass
(bucket writes, statuses, dead letters). The adapter against a real apiserver and NATS:
tests/integration/k8s/test_fraction_policies.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fracpilot_actuator.policy_sync.objects import (
    InvalidPolicyError,
    PolicyObject,
    to_policy,
)
from fracpilot_actuator.policy_sync.plan import SyncPlan, plan_sync, status_patch
from fracpilot_libs.contracts import Mode, Policy, PolicyLevel, PolicyScope, WorkloadRef
from fracpilot_libs.kube.policy_crd import spec_fields
from fracpilot_libs.sizing.policies import LivePolicies

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
CHAT = PolicyScope(
    level=PolicyLevel.WORKLOAD, namespace="team-a", workload="chat", kind="Deployment"
)
TEAM_A = PolicyScope(level=PolicyLevel.NAMESPACE, namespace="team-a")


def fp(
    name: str = "chat",
    target: str | None = "chat",
    created: str = "2026-12-01T00:00:00Z",
    generation: int = 1,
    status: dict[str, Any] | None = None,
    kind: str | None = "Deployment",
    **spec: Any,
) -> PolicyObject:
    if target is not None:
        spec["targetRef"] = {"name": target} | ({"kind": kind} if kind else {})
    return PolicyObject(
        "FractionPolicy", "team-a", name, f"uid-{name}", generation, created, spec, status or {}
    )


def cluster_default(name: str = "default", **spec: Any) -> PolicyObject:
    return PolicyObject("ClusterFractionPolicy", "", name, "uid-c", 1, "2026-11-01T00:00:00Z", spec)


def condition(plan: SyncPlan, obj: PolicyObject, kind: str) -> dict[str, Any]:
    [found] = [c for c in plan.statuses[obj.key]["conditions"] if c["type"] == kind]
    return dict(found)


def settled(objs: list[PolicyObject], plan: SyncPlan) -> list[PolicyObject]:
    """The objects with the plan's statuses written (as the next pass would read them)."""
    return [
        PolicyObject(
            o.kind,
            o.namespace,
            o.name,
            o.uid,
            o.generation,
            o.created,
            o.spec,
            plan.statuses.get(o.key, o.status),
        )
        for o in objs
    ]


def applied(stored: dict[str, Policy], plan: SyncPlan) -> dict[str, Policy]:
    out = {**stored, **plan.puts}
    for key in plan.deletes:
        out.pop(key)
    return out


# --- one object -> a Policy ---------------------------------------------------------------


def test_a_fraction_policy_reads_as_a_workload_policy_in_its_namespace() -> None:
    policy = to_policy(fp(mode="recommend", minFraction=0.25, cooldownSeconds=60))
    assert policy.scope == CHAT
    assert policy.mode is Mode.RECOMMEND
    assert policy.min_fraction == 0.25
    assert policy.cooldown_s == 60
    assert policy.max_fraction == Policy().max_fraction  # left out: the model's default


def test_the_target_kind_is_part_of_the_scope_and_may_be_left_out() -> None:
    stateful = to_policy(fp(kind="StatefulSet")).scope
    assert stateful == CHAT.model_copy(update={"kind": "StatefulSet"})
    assert stateful.key == "workload.team-a.StatefulSet/chat"
    assert to_policy(fp(kind=None)).scope == CHAT.model_copy(update={"kind": None})
    with pytest.raises(InvalidPolicyError, match=r"targetRef\.kind 'Rollout' is not one of"):
        to_policy(fp(kind="Rollout"))


def test_a_statefulset_policy_leaves_the_deployment_of_the_same_name_alone() -> None:
    """A Deployment and a StatefulSet named chat in team-a: each object sizes its own kind,
    neither shadows the other; the workloads resolve as the decision service resolves them."""
    deployment_fp = fp("chat-deployment", kind="Deployment", maxFraction=0.25)
    stateful_fp = fp("chat-statefulset", kind="StatefulSet", maxFraction=0.5)
    plan = plan_sync([deployment_fp, stateful_fp], {}, T0)
    assert sorted(plan.puts) == [
        "kubernetes.workload.team-a.Deployment/chat",
        "kubernetes.workload.team-a.StatefulSet/chat",
    ]
    for obj in (deployment_fp, stateful_fp):
        assert condition(plan, obj, "Ready")["status"] == "True"
        assert condition(plan, obj, "Shadowed")["status"] == "False"
    live = LivePolicies(Policy())
    for key, policy in plan.puts.items():
        live.apply(key, policy)
    chat = WorkloadRef(namespace="team-a", owner_name="chat")
    assert live.for_workload(chat.model_copy(update={"owner_kind": "Deployment"})).max_fraction == (
        0.25
    )
    assert live.for_workload(
        chat.model_copy(update={"owner_kind": "StatefulSet"})
    ).max_fraction == (0.5)
    assert live.for_workload(chat.model_copy(update={"owner_kind": "Job"})) is live.default
    # Only the StatefulSet's: the Deployment chat gets the default.
    only = plan_sync([stateful_fp], {}, T0)
    live = LivePolicies(Policy())
    for key, policy in only.puts.items():
        live.apply(key, policy)
    assert live.for_workload(chat) is live.default
    assert live.for_workload(
        chat.model_copy(update={"owner_kind": "StatefulSet"})
    ).max_fraction == (0.5)


def test_without_a_target_it_is_the_namespace_policy_and_the_cluster_kind_is_the_cluster() -> None:
    assert to_policy(fp(target=None)).scope == TEAM_A
    assert to_policy(cluster_default(maxFraction=0.5)).scope == PolicyScope()


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (fp(minFraction=0.5, maxFraction=0.25), "minFraction 0.5 is above maxFraction 0.25"),
        (fp(mode="sideways"), "mode: Input should be 'recommend' or 'auto'"),
        (fp(gridSteps=0), "gridSteps: Input should be greater than or equal to 1"),
        (fp(surprise=1), "unknown spec field(s): surprise"),
        (fp(target="a..b"), "may contain only letters"),
        (cluster_default("other"), "the one ClusterFractionPolicy is named 'default'"),
        (cluster_default(targetRef={"name": "x"}), "unknown spec field(s): targetRef"),
    ],
)
def test_an_invalid_object_says_why_in_the_specs_words(obj: PolicyObject, reason: str) -> None:
    with pytest.raises(InvalidPolicyError) as info:
        to_policy(obj)
    assert reason in str(info.value)


_VALUES = st.one_of(
    st.integers(-5, 200), st.floats(-1, 200, allow_nan=False), st.sampled_from(["auto", "x"])
)


@given(spec=st.dictionaries(st.sampled_from(sorted(spec_fields())), _VALUES, max_size=4))
def test_an_object_is_valid_exactly_when_the_policy_is(spec: dict[str, Any]) -> None:
    fields = spec_fields()
    try:
        Policy.model_validate({fields[k]: v for k, v in spec.items()} | {"scope": CHAT})
        expected = True
    except ValidationError:
        expected = False
    try:
        to_policy(fp(**spec))
        valid = True
    except InvalidPolicyError:
        valid = False
    assert valid == expected


# --- a pass: the bucket and the statuses --------------------------------------------------


def test_a_new_object_is_stored_under_the_kubernetes_key_and_reported_ready() -> None:
    obj = fp(maxFraction=0.5)
    plan = plan_sync([obj], {}, T0)
    [(key, stored)] = plan.puts.items()
    assert key == f"kubernetes.{CHAT.key}"
    assert (stored.scope, stored.max_fraction, stored.revision) == (CHAT, 0.5, 1)
    status = plan.statuses[obj.key]
    assert status["inForce"] == "FractionPolicy/chat"
    assert status["scope"] == CHAT.key
    assert (status["mode"], status["maxFraction"], status["policyRevision"]) == ("auto", 0.5, 1)
    assert status["observedGeneration"] == 1
    assert condition(plan, obj, "Ready")["status"] == "True"
    assert condition(plan, obj, "Invalid")["status"] == "False"
    assert condition(plan, obj, "Shadowed")["status"] == "False"
    assert plan.states["FractionPolicy", "ready"] == 1


def test_a_second_pass_changes_nothing() -> None:
    objs = [fp(maxFraction=0.5), fp("ns", target=None), cluster_default()]
    first = plan_sync(objs, {}, T0)
    again = plan_sync(settled(objs, first), applied({}, first), T0 + timedelta(minutes=1))
    assert (again.puts, again.deletes, again.statuses) == ({}, (), {})


def test_an_update_takes_the_next_revision_and_keeps_the_transition_time() -> None:
    first = plan_sync([fp(maxFraction=0.5)], {}, T0)
    [old] = settled([fp(maxFraction=0.5)], first)
    changed = fp(maxFraction=0.75, generation=2, status=dict(old.status))
    plan = plan_sync([changed], applied({}, first), T0 + timedelta(hours=1))
    assert plan.puts[f"kubernetes.{CHAT.key}"].revision == 2
    ready = condition(plan, changed, "Ready")
    assert ready["lastTransitionTime"] == "2026-12-03T12:00:00Z"  # still Ready: no transition
    assert ready["observedGeneration"] == 2


def test_the_older_object_of_a_scope_wins_and_the_other_is_shadowed() -> None:
    older = fp("a-older", maxFraction=0.5, created="2026-12-01T00:00:00Z")
    newer = fp("b-newer", maxFraction=0.25, created="2026-12-02T00:00:00Z")
    plan = plan_sync([newer, older], {}, T0)
    assert plan.puts[f"kubernetes.{CHAT.key}"].max_fraction == 0.5
    assert condition(plan, newer, "Shadowed")["status"] == "True"
    assert condition(plan, newer, "Ready")["reason"] == "Shadowed"
    assert plan.statuses[newer.key]["inForce"] == "FractionPolicy/a-older"
    assert plan.states["FractionPolicy", "shadowed"] == 1


def test_the_object_wins_over_a_nats_policy_of_its_scope_and_says_so() -> None:
    nats_policy = Policy(scope=CHAT, max_fraction=0.75, revision=4)
    obj = fp(maxFraction=0.5)
    plan = plan_sync([obj], {CHAT.key: nats_policy}, T0)
    assert CHAT.key not in plan.puts  # a NATS policy is never touched
    assert "over the policy set over NATS" in condition(plan, obj, "Ready")["message"]
    live = LivePolicies(Policy())
    for key, policy in applied({CHAT.key: nats_policy}, plan).items():
        live.apply(key, policy)
    assert live.stored[CHAT.key].max_fraction == 0.5


def test_deleting_the_object_deletes_its_entry_and_the_nats_policy_is_in_force_again() -> None:
    nats_policy = Policy(scope=CHAT, max_fraction=0.75, revision=4)
    first = plan_sync([fp(maxFraction=0.5)], {CHAT.key: nats_policy}, T0)
    stored = applied({CHAT.key: nats_policy}, first)
    plan = plan_sync([], stored, T0)
    assert plan.deletes == (f"kubernetes.{CHAT.key}",)
    assert applied(stored, plan) == {CHAT.key: nats_policy}


def test_an_invalid_object_sets_nothing_is_reported_once_and_says_what_is_in_force() -> None:
    bad = fp(minFraction=0.5, maxFraction=0.25)
    namespace_policy = Policy(scope=TEAM_A, max_fraction=0.85)
    plan = plan_sync([bad], {TEAM_A.key: namespace_policy}, T0)
    assert plan.puts == {}
    invalid = condition(plan, bad, "Invalid")
    assert invalid["status"] == "True"
    assert "minFraction 0.5 is above maxFraction 0.25" in invalid["message"]
    assert condition(plan, bad, "Ready")["status"] == "False"
    assert plan.statuses[bad.key]["inForce"] == f"nats:{TEAM_A.key}"  # up the scope chain
    assert "maxFraction" not in plan.statuses[bad.key]
    assert [o.key for o, _ in plan.newly_invalid] == [bad.key]
    [reported] = settled([bad], plan)
    assert plan_sync([reported], {}, T0).newly_invalid == ()  # once per generation


def test_an_object_that_became_invalid_gives_its_scope_back() -> None:
    first = plan_sync([fp(maxFraction=0.5)], {}, T0)
    broken = fp(maxFraction=0.3, gridSteps=4, grid="steps", generation=2)
    plan = plan_sync([broken], applied({}, first), T0)
    assert plan.deletes == (f"kubernetes.{CHAT.key}",)
    assert plan.statuses[broken.key]["inForce"] == "default"


def test_the_cluster_default_object_is_the_cluster_scope() -> None:
    obj = cluster_default(mode="recommend")
    plan = plan_sync([obj, fp("ns", target=None)], {}, T0)
    assert plan.puts["kubernetes.cluster"].mode is Mode.RECOMMEND
    assert plan.statuses[obj.key]["target"] == "(cluster)"
    assert plan.statuses[obj.key]["inForce"] == "ClusterFractionPolicy/default"


def test_a_status_patch_nulls_the_fields_that_went() -> None:
    old = {"scope": "x", "minFraction": 0.5, "conditions": []}
    assert status_patch(old, {"scope": "x", "conditions": []}) == {
        "status": {"minFraction": None, "scope": "x", "conditions": []}
    }


# --- the decision side: a kubernetes entry wins at its scope ------------------------------


def test_live_policies_prefer_the_kubernetes_entry_and_fall_back_when_it_goes() -> None:
    live = LivePolicies(Policy())
    nats_policy = Policy(scope=CHAT, max_fraction=0.75)
    kube_policy = Policy(scope=CHAT, max_fraction=0.5)
    live.apply(CHAT.key, nats_policy)
    live.apply(f"kubernetes.{CHAT.key}", kube_policy)
    assert live.stored[CHAT.key] is kube_policy
    live.apply(CHAT.key, Policy(scope=CHAT, max_fraction=0.25))  # a later NATS set: shadowed
    assert live.stored[CHAT.key] is kube_policy
    live.apply(f"kubernetes.{CHAT.key}", None)
    assert live.stored[CHAT.key].max_fraction == 0.25
    live.apply(CHAT.key, None)
    assert CHAT.key not in live.stored
