"""Owner guesses from pod names, when the Kubernetes API is not configured."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fracpilot_ingest.owners import OwnerResolver, PodNameOwners
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.owners import owner_from_pod_name

SAFE = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery rand.SafeEncodeString alphabet


def owner(pod: str) -> tuple[str, str]:
    ref = owner_from_pod_name("prod", "inference", pod)
    return ref.owner_kind, ref.owner_name


@pytest.mark.parametrize(
    ("pod", "kind", "name"),
    [
        ("chat-7c9d5f8b6d-x2k4p", "Deployment", "chat"),
        ("vllm-llama-3-8b-7c9d5f8b6d-x2k4p", "Deployment", "vllm-llama-3-8b"),
        ("coredns-5d78c9869d-8xq2z", "Deployment", "coredns"),
        ("api-2-58f6d4bb9-wzvxk", "Deployment", "api-2"),  # name ending in a digit
        ("a-bcdfgh-bcdfg", "Deployment", "a"),  # shortest hash (6) accepted
        ("web-0", "StatefulSet", "web"),
        ("triton-server-12", "StatefulSet", "triton-server"),
        ("kv-store-v2-3", "StatefulSet", "kv-store-v2"),
        ("sglang-7c9d5f8b6d-1", "StatefulSet", "sglang-7c9d5f8b6d"),  # hash-like name
        ("db-bcdfgh-0", "StatefulSet", "db-bcdfgh"),
        ("cache-x2k4p-7", "StatefulSet", "cache-x2k4p"),  # suffix-like name
        ("debug", "Pod", "debug"),
        ("my-notebook", "Pod", "my-notebook"),
        ("train-job-x7k2p", "Pod", "train-job-x7k2p"),  # Job pod: no template hash
        ("dcgm-exporter-78z52", "Pod", "dcgm-exporter-78z52"),  # DaemonSet pod
        ("backup-28391234-x7k2p", "Pod", "backup-28391234-x7k2p"),  # CronJob: 1 and 3 unsafe
        ("chat-7c9d5f8b6d-x2k4", "Pod", "chat-7c9d5f8b6d-x2k4"),  # suffix of 4
        ("chat-7c9d5f8b6d-X2K4P", "Pod", "chat-7c9d5f8b6d-X2K4P"),  # not the alphabet
        ("chat-7c9d5-x2k4p", "Pod", "chat-7c9d5-x2k4p"),  # hash of 5 is too short
    ],
)
def test_owner_from_pod_name(pod: str, kind: str, name: str) -> None:
    assert owner(pod) == (kind, name)


def test_the_workload_carries_cluster_and_namespace() -> None:
    ref = owner_from_pod_name("prod", "inference", "chat-7c9d5f8b6d-x2k4p")
    assert ref == WorkloadRef(
        cluster="prod", namespace="inference", owner_kind="Deployment", owner_name="chat"
    )
    assert ref.key == "prod/inference/Deployment/chat"


def test_pods_of_one_deployment_share_a_workload_across_rollouts() -> None:
    pods = ["chat-7c9d5f8b6d-x2k4p", "chat-7c9d5f8b6d-m8n2b", "chat-5f6b9c8d47-q7w9z"]
    assert {owner(p) for p in pods} == {("Deployment", "chat")}


def test_pods_of_one_statefulset_share_a_workload() -> None:
    assert {owner(f"triton-{i}") for i in range(12)} == {("StatefulSet", "triton")}


async def test_resolver_uses_its_cluster() -> None:
    resolver: OwnerResolver = PodNameOwners("edge")
    ref = await resolver.resolve("team-a", "web-1")
    assert (ref.cluster, ref.namespace, ref.owner_kind, ref.owner_name) == (
        "edge",
        "team-a",
        "StatefulSet",
        "web",
    )


name_part = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
names = st.lists(name_part, min_size=1, max_size=4).map("-".join)


@given(
    name=names,
    template_hash=st.text(SAFE, min_size=6, max_size=10),
    suffix=st.text(SAFE, min_size=5, max_size=5),
)
def test_any_deployment_pod_name_gives_back_the_deployment(
    name: str, template_hash: str, suffix: str
) -> None:
    assert owner(f"{name}-{template_hash}-{suffix}") == ("Deployment", name)


@given(name=names, ordinal=st.integers(0, 9999))
def test_any_statefulset_pod_name_gives_back_the_statefulset(name: str, ordinal: int) -> None:
    # Ordinals below 10000 have at most 4 digits, so never look like a 5-character suffix.
    assert owner(f"{name}-{ordinal}") == ("StatefulSet", name)
