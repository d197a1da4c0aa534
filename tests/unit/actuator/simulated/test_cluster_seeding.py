"""The simulated cluster's pure seeding helpers."""

from __future__ import annotations

import pytest

from factories import GIB, workload
from fracpilot_actuator.simulated.cluster import parse_seed_pods, seed_cluster
from fracpilot_libs.contracts import WorkloadRef

MEM = 80 * GIB


def test_seed_cluster_places_first_fit_in_order() -> None:
    pods = [
        (workload("a"), 0.5),
        (workload("b"), 0.75),
        (workload("c"), 0.5),
        (workload("d"), 0.25),
    ]
    state = seed_cluster(nodes=2, gpus_per_node=1, memory_bytes=MEM, pods=pods)
    assert [g.uuid for g in state.gpus] == ["GPU-sim-node-0-0", "GPU-sim-node-1-0"]
    assert state.nodes == ("sim-node-0", "sim-node-1")
    where = {p.workload.owner_name: p.gpu_uuid for p in state.placements}
    assert where == {
        "a": "GPU-sim-node-0-0",
        "b": "GPU-sim-node-1-0",  # does not fit next to a
        "c": "GPU-sim-node-0-0",  # first fit: back on the first GPU
        "d": "GPU-sim-node-1-0",
    }
    assert {p.pod for p in state.placements} == {"a-0", "b-0", "c-0", "d-0"}
    assert all(g.memory_bytes == MEM for g in state.gpus)


def test_seed_cluster_raises_when_seeds_do_not_fit() -> None:
    pods = [(workload("a"), 0.75), (workload("b"), 0.75), (workload("c"), 0.5)]
    with pytest.raises(ValueError, match="do not fit"):
        seed_cluster(nodes=1, gpus_per_node=2, memory_bytes=MEM, pods=pods)


def test_seed_cluster_with_no_pods_is_just_gpus() -> None:
    state = seed_cluster(nodes=2, gpus_per_node=3, memory_bytes=MEM, pods=[])
    assert len(state.gpus) == 6
    assert state.placements == ()


def test_parse_seed_pods() -> None:
    pods = parse_seed_pods("ns/a=0.5,ns/b=0.25", cluster="demo")
    assert pods == [
        (WorkloadRef(cluster="demo", namespace="ns", owner_name="a"), 0.5),
        (WorkloadRef(cluster="demo", namespace="ns", owner_name="b"), 0.25),
    ]


def test_parse_seed_pods_tolerates_spaces_and_empty_items() -> None:
    pods = parse_seed_pods(" ns/a=0.5 , ,other/b=1.0,", cluster="c")
    assert [(w.namespace, w.owner_name, f) for w, f in pods] == [
        ("ns", "a", 0.5),
        ("other", "b", 1.0),
    ]
    assert parse_seed_pods("", cluster="c") == []


@pytest.mark.parametrize(
    "spec", ["ns/a", "a=0.5", "/a=0.5", "ns/=0.5", "ns/a=", "=0.5", "ns/a=abc"]
)
def test_parse_seed_pods_rejects_malformed_items(spec: str) -> None:
    with pytest.raises(ValueError, match=r"namespace/name=fraction|could not convert"):
        parse_seed_pods(spec, cluster="c")
