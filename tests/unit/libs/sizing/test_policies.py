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
    keys = tuple(s.key for s in scope_chain(WORKLOAD))
    assert keys == workload_chain_keys("inference", "chat")


def test_the_most_specific_stored_policy_wins_as_a_whole() -> None:
    default = Policy(max_fraction=0.75)
    cluster = Policy(min_fraction=0.25)
    namespace = Policy(scope=NAMESPACE, max_fraction=0.5)
    keys = workload_chain_keys("inference", "chat")
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
    assert parse_scope(workload("chat").to_json()) == WORKLOAD
    with pytest.raises(DecodeError) as refused:
        parse_scope(b"{not json")
    assert refused.value.kind == "decode"
