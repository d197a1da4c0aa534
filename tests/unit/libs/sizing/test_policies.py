"""Policy resolution: the most specific stored policy as a whole, else the cluster default."""

from __future__ import annotations

import pytest

from factories import workload
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Policy, PolicyLevel, PolicyScope
from fracpilot_libs.nats.decoding import DecodeError
from fracpilot_libs.sizing.policies import (
    ClusterPolicySettings,
    LivePolicies,
    cluster_default,
    next_revision,
    parse_scope,
    resolve,
    scope_chain,
    workload_chain_keys,
)

NAMESPACE = PolicyScope(level=PolicyLevel.NAMESPACE, namespace="inference")
WORKLOAD = PolicyScope(level=PolicyLevel.WORKLOAD, namespace="inference", workload="chat")


class _Settings(ServiceSettings, ClusterPolicySettings):
    pass


def test_the_cluster_default_is_the_setting_else_the_built_in_policy() -> None:
    assert cluster_default(None) == Policy()
    assert cluster_default("") == Policy()
    assert cluster_default('{"max_fraction": 0.5}').max_fraction == 0.5


def test_the_cluster_default_must_be_a_cluster_scope_policy() -> None:
    with pytest.raises(ValueError, match="cluster-scope"):
        cluster_default(Policy(scope=NAMESPACE).to_json().decode())


def test_the_setting_reads_fracpilot_policy_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACPILOT_POLICY_JSON", '{"min_fraction": 0.25}')
    assert cluster_default(_Settings().policy_json).min_fraction == 0.25


def test_the_chain_keys_spell_the_scope_keys() -> None:
    keys = tuple(s.key for s in scope_chain(WORKLOAD.model_copy(update={"kind": "StatefulSet"})))
    assert keys == workload_chain_keys("inference", "chat", "StatefulSet")
    assert keys[:2] == ("workload.inference.StatefulSet/chat", "workload.inference.chat")


def test_a_workload_policy_of_one_kind_sizes_that_kind_only() -> None:
    """A StatefulSet and a Deployment of one name in one namespace are two workloads: a policy
    for the StatefulSet leaves the Deployment alone; one without a kind sizes both."""
    live = LivePolicies(Policy())
    stateful = WORKLOAD.model_copy(update={"kind": "StatefulSet"})
    live.apply(stateful.key, Policy(scope=stateful, max_fraction=0.5))
    sts = workload("chat").model_copy(update={"owner_kind": "StatefulSet"})
    deployment = workload("chat").model_copy(update={"owner_kind": "Deployment"})
    assert live.for_workload(sts).max_fraction == 0.5
    assert live.for_workload(deployment) is live.default
    any_kind = Policy(scope=WORKLOAD, max_fraction=0.25)
    live.apply(WORKLOAD.key, any_kind)
    assert live.for_workload(deployment) == any_kind
    assert live.for_workload(sts).max_fraction == 0.5  # its kind's policy is more specific


def test_a_kind_belongs_to_a_workload_scope_and_is_left_out_when_unset() -> None:
    with pytest.raises(ValueError, match="takes no kind"):
        PolicyScope(level=PolicyLevel.NAMESPACE, namespace="inference", kind="StatefulSet")
    with pytest.raises(ValueError, match="kind"):  # a dot would make the key ambiguous
        PolicyScope.model_validate({**WORKLOAD.model_dump(), "kind": "Stateful.Set"})
    # Written as before the kind existed (older services refuse unknown fields)...
    assert "kind" not in WORKLOAD.model_dump()
    assert "kind" not in Policy(scope=WORKLOAD).model_dump(mode="json")["scope"]
    # ... and read back either way.
    stateful = WORKLOAD.model_copy(update={"kind": "StatefulSet"})
    assert PolicyScope.model_validate_json(stateful.model_dump_json()) == stateful
    assert PolicyScope.model_validate({**WORKLOAD.model_dump(), "kind": None}) == WORKLOAD


def test_the_most_specific_stored_policy_wins_as_a_whole() -> None:
    default = Policy(max_fraction=0.75)
    cluster = Policy(min_fraction=0.25)
    namespace = Policy(scope=NAMESPACE, max_fraction=0.5)
    keys = workload_chain_keys("inference", "chat", "Deployment")
    assert resolve({}, keys, default) is default
    assert resolve({"cluster": cluster}, keys, default) is cluster
    stored = {"cluster": cluster, NAMESPACE.key: namespace}
    chosen = resolve(stored, keys, default)
    assert chosen is namespace
    assert chosen.min_fraction == Policy().min_fraction  # never merged with the cluster's


def test_live_policies_follow_changes_per_workload() -> None:
    live = LivePolicies(Policy())
    mine, other = workload("chat"), workload("chat", namespace="batch")
    live.apply(WORKLOAD.key, Policy(scope=WORKLOAD, max_fraction=0.5))
    assert live.for_workload(mine).scope == WORKLOAD
    assert live.for_workload(other) is live.default
    live.apply(WORKLOAD.key, None)
    assert live.for_workload(mine) is live.default


def test_the_store_numbers_revisions_from_one() -> None:
    first = next_revision(Policy(revision=7), None)
    assert first.revision == 1
    assert next_revision(Policy(), first).revision == 2


def test_a_get_request_names_a_scope_a_workload_or_the_cluster() -> None:
    assert parse_scope(b"  ") == PolicyScope()
    assert parse_scope(NAMESPACE.to_json()) == NAMESPACE
    # A workload's own scope: its kind's (the chain goes on to any kind of that name).
    assert parse_scope(workload("chat").to_json()) == WORKLOAD.model_copy(
        update={"kind": "Deployment"}
    )
    with pytest.raises(DecodeError) as refused:
        parse_scope(b"{not json")
    assert refused.value.kind == "decode"
