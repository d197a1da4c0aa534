"""What ingest reads from cached pods: KAI's GPU groups and out-of-memory kills."""

from __future__ import annotations

from typing import Any

import pytest

from fracpilot_ingest.pod_facts import kai_shared_gpus, oom_kills, pod_projection
from fracpilot_libs.usage.attribution import GpuInventory, MetricPoint, PodKey, observe_points
from fracpilot_libs.usage.mappings import MappingTable
from fracpilot_libs.usage.signals import OomKill

GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
MIB = 1024**2


def pod(
    namespace: str,
    name: str,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    statuses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "resourceVersion": "7",
            "labels": {"app": "x", **(labels or {})},
            "annotations": {"other": "y", **(annotations or {})},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}],
        },
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": phase, "containerStatuses": statuses or []},
    }


RESERVATION = pod(
    "kai-resource-reservation",
    "gpu-reservation-1a2b",
    {"runai-gpu-group": "g1", "app": "kai-resource-reservation"},
    {"run.ai/reserve_for_gpu_index": GPU},
)
CHAT = pod("team-a", "chat-0", {"runai-gpu-group": "g1"}, {"gpu-fraction": "0.5"})
EMBED = pod("team-b", "embed-0", {"runai-gpu-group": "g1"}, {"gpu-memory": "20480"})


def test_pods_of_a_kai_group_share_its_reserved_gpu() -> None:
    shared = kai_shared_gpus([RESERVATION, CHAT, EMBED], {GPU: 81_920 * MIB})
    assert shared == {GPU: {("team-a", "chat-0"): 0.5, ("team-b", "embed-0"): 0.25}}


def test_group_without_its_reservation_pod_names_no_gpu() -> None:
    assert kai_shared_gpus([CHAT, EMBED]) == {}


def test_finished_pods_and_unknown_fractions() -> None:
    done = pod("team-a", "old-0", {"runai-gpu-group": "g1"}, {"gpu-fraction": "0.5"}, "Succeeded")
    odd = pod("team-a", "odd-0", {"runai-gpu-group": "g1"}, {"gpu-fraction": "lots"})
    shared = kai_shared_gpus([RESERVATION, done, odd, EMBED])  # no device memory known
    assert shared == {GPU: {("team-a", "odd-0"): None, ("team-b", "embed-0"): None}}


def test_projection_keeps_owners_kai_fields_and_last_terminations_only() -> None:
    oom = {
        "name": "main",
        "restartCount": 3,
        "ready": True,
        "lastState": {
            "terminated": {
                "reason": "OOMKilled",
                "exitCode": 137,
                "finishedAt": "2026-03-02T10:00:00Z",
                "containerID": "containerd://abc",
            }
        },
    }
    fresh = {"name": "side", "restartCount": 0, "lastState": {}}
    kept = pod_projection(
        pod(
            "team-a",
            "chat-0",
            {"runai-gpu-group": "g1"},
            {"gpu-fraction": "0.5"},
            statuses=[oom, fresh],
        )
    )
    assert kept["metadata"]["labels"] == {"runai-gpu-group": "g1"}
    assert kept["metadata"]["annotations"] == {"gpu-fraction": "0.5"}
    assert kept["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert "spec" not in kept
    assert kept["status"] == {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "main",
                "restartCount": 3,
                "lastState": {
                    "terminated": {
                        "reason": "OOMKilled",
                        "exitCode": 137,
                        "finishedAt": "2026-03-02T10:00:00Z",
                    }
                },
            }
        ],
    }
    assert oom_kills([kept]) == [OomKill("team-a", "chat-0", "main", "2026-03-02T10:00:00Z")]


def test_other_terminations_are_no_oom() -> None:
    error = {"name": "main", "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}
    assert oom_kills([pod("a", "p", statuses=[error])]) == []


# Log tails as the kubelet puts them in the termination message (FallbackToLogsOnError).
TORCH_OOM = (
    '  File "/app/serve.py", line 88, in forward\n'
    "    hidden = self.mlp(hidden)\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 39.38 GiB of which 1.12 GiB is free. Process 4211 has 38.25 GiB memory in use."
)
DRIVER_OOM = "RuntimeError: CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
RUNTIME_OOM = "cudaMalloc failed: cudaErrorMemoryAllocation: out of memory"
VLLM_OOM = (
    "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine."
)


@pytest.mark.parametrize("message", [TORCH_OOM, DRIVER_OOM, RUNTIME_OOM, VLLM_OOM])
def test_a_cuda_out_of_memory_exit_is_an_oom_and_its_message_is_kept(message: str) -> None:
    ended = {
        "name": "main",
        "restartCount": 1,
        "lastState": {
            "terminated": {
                "reason": "Error",
                "exitCode": 1,
                "finishedAt": "2026-03-02T10:00:00Z",
                "message": message,
            }
        },
    }
    kept = pod_projection(pod("team-a", "chat-0", statuses=[ended]))
    assert kept["status"]["containerStatuses"][0]["lastState"]["terminated"]["message"] == message
    assert oom_kills([kept]) == [OomKill("team-a", "chat-0", "main", "2026-03-02T10:00:00Z")]


@pytest.mark.parametrize(
    "message",
    [
        "Exception in thread main java.lang.OutOfMemoryError: Java heap space",
        "MemoryError: Unable to allocate 3.00 GiB for an array",
        "RuntimeError: CUDA error: device-side assert triggered",
    ],
)
def test_other_failure_messages_are_no_oom_and_not_cached(message: str) -> None:
    ended = {
        "name": "main",
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": message}},
    }
    kept = pod_projection(pod("a", "p", statuses=[ended]))
    assert "message" not in kept["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert oom_kills([kept]) == []


def test_a_kai_neighbour_no_series_names_gets_an_estimated_share() -> None:
    labels = {"UUID": GPU, "gpu": "0", "Hostname": "n", "modelName": "NVIDIA A100-SXM4-80GB"}
    labels |= {"pod": "chat-0", "namespace": "team-a", "container": "main"}
    points = [
        MetricPoint("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, 0.9, 1.0),
        MetricPoint("DCGM_FI_DEV_FB_USED", labels, 30_000, 1.0),
        MetricPoint("DCGM_FI_DEV_FB_FREE", labels, 51_920, 1.0),
    ]
    shared = kai_shared_gpus([RESERVATION, CHAT, EMBED], {GPU: 81_920 * MIB})
    inventory = GpuInventory(
        fractions={GPU: {PodKey(ns, name): f for (ns, name), f in shared[GPU].items()}}
    )
    observations, rejections = observe_points(points, MappingTable.of(), inventory)
    assert rejections == []
    by_pod = {o.pod.pod: o for o in observations}
    assert by_pod["chat-0"].compute == pytest.approx(0.6)
    assert by_pod["embed-0"].compute == pytest.approx(0.3)
    assert not by_pod["chat-0"].exact
    assert not by_pod["embed-0"].exact
