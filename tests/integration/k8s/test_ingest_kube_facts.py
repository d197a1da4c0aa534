"""Ingest with the Kubernetes owners (a real kube-apiserver) and a real Prometheus: what the
cached pods tell ingest besides owners.

- KAI's GPU group (a reservation pod naming the GPU, two fraction pods with the group label):
  dcgm labels only one of the pods, and both get an estimated split by their fractions;
- HAMi's node register annotation gives the device memory HAMi's metrics lack;
- a container OOM-killed, or exited on a CUDA out-of-memory error (its log tail in the
  termination message, as the kubelet reports it with FallbackToLogsOnError), marks one sample
  of its pod ``oom_event``, and the engine upsizes on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from fracpilot_ingest.owners import KubernetesOwners
from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.contracts import (
    Allocation,
    Attribution,
    Policy,
    ReasonCode,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState
from helpers import put_allocations, read_usage, reset_nats, running, wait_for
from support.dcgm_prometheus import DCGM_POD
from support.gpu_exporter import (
    GpuState,
    GpuTestExporter,
    PodOnGpu,
    dcgm_device_metrics,
    hami_metrics,
    hami_node_register,
)
from support.kube import KAI_GROUP, MERGE_PATCH, gpu_node, kai_reservation, running_pod
from support.prometheus_server import PrometheusServer, ScrapeTarget

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MIB = 1024 * 1024
STEP = 1.0
NODE = "gpu-node-kai"


@pytest.fixture(scope="module")
def exporter() -> Iterator[GpuTestExporter]:
    with GpuTestExporter() as exporter:
        exporter.set_metrics("", "/dcgm")
        exporter.set_metrics("", "/hami")
        yield exporter


@pytest.fixture(scope="module")
def prom(exporter: GpuTestExporter) -> Iterator[PrometheusServer]:
    targets = [
        ScrapeTarget("dcgm", exporter.address, "/dcgm", labels=DCGM_POD),
        ScrapeTarget("hami", exporter.address, "/hami"),
    ]
    with PrometheusServer(targets, scrape_interval=STEP) as server:
        server.wait_for_targets_up(timeout=30)
        yield server


def _published(service: IngestService) -> float:
    return sum(
        s.value
        for m in service.metrics.published.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )


async def _samples(url: str) -> list[UsageSample]:
    return [UsageSample.model_validate_json(d) for _, d in await read_usage(url)]


def _service(
    nats_url: str, prom: PrometheusServer, api: client.ApiClient, job: str = "dcgm"
) -> IngestService:
    settings = IngestSettings(
        nats={"url": nats_url},
        interval_s=STEP,
        backfill_s=3.0,
        cluster="test",
        sources="prometheus",
        owners="kubernetes",
        hami_nodes=True,
        prometheus={"url": prom.url, "matchers": f'job="{job}"'},  # type: ignore[arg-type]
    )
    return IngestService(settings, owners=KubernetesOwners(api, "test", nodes=True))


async def test_kai_group_splits_a_gpu_dcgm_names_one_pod_of(
    nats_url: str,
    prom: PrometheusServer,
    exporter: GpuTestExporter,
    kube_admin: client.ApiClient,
    kube_namespace: str,
) -> None:
    ns, group = kube_namespace, f"group-{kube_namespace}"
    uuid = f"GPU-{kube_namespace}-0000-4000-8000-00000000kai"
    core = client.CoreV1Api(kube_admin)
    kai_reservation(core, group, NODE, uuid)
    for name, fraction in (("chat-0", "0.5"), ("embed-0", "0.25")):
        running_pod(
            core, ns, name, NODE, labels={KAI_GROUP: group}, annotations={"gpu-fraction": fraction}
        )
    labelled = PodOnGpu(ns, "chat-0", "main", util_pct=0, memory_used_mib=0)
    gpu = GpuState(
        uuid, NODE, "NVIDIA A100-SXM4-80GB", 81_920, util_pct=90, pods=[labelled],
        memory_used_mib=30_000,
    )  # fmt: skip
    exporter.set_metrics(dcgm_device_metrics([gpu]), "/dcgm")
    prom.wait_for_series(f'DCGM_FI_DEV_FB_USED{{exported_namespace="{ns}"}}', timeout=30)
    await reset_nats(nats_url)
    service = _service(nats_url, prom, kube_admin)
    async with running(service):
        await wait_for(lambda: _published(service) >= 2, timeout=30)
    latest = {s.pod: s for s in sorted(await _samples(nats_url), key=lambda s: s.timestamp)}
    chat, embed = latest["chat-0"], latest["embed-0"]
    assert chat.attribution is Attribution.ESTIMATED
    assert embed.attribution is Attribution.ESTIMATED
    assert chat.compute == pytest.approx(0.9 * 2 / 3)
    assert embed.compute == pytest.approx(0.9 * 1 / 3)
    assert chat.memory_used_bytes == pytest.approx(30_000 * MIB * 2 / 3, abs=1)
    assert (chat.allocated_fraction, embed.allocated_fraction) == (0.5, 0.25)


async def test_hami_device_memory_from_the_node_register_annotation(
    nats_url: str,
    prom: PrometheusServer,
    exporter: GpuTestExporter,
    kube_admin: client.ApiClient,
    kube_namespace: str,
) -> None:
    ns = kube_namespace
    node = f"hami-{ns}"
    pod = PodOnGpu(ns, "tts-0", "server", util_pct=35, memory_used_mib=7_000)
    gpu = GpuState(
        f"GPU-{ns}-0000-4000-8000-0000000hami", node, "NVIDIA L4", 23_034, util_pct=35, pods=[pod]
    )
    core = client.CoreV1Api(kube_admin)
    gpu_node(core, node, 1, {})
    core.patch_node(
        node,
        {"metadata": {"annotations": {"hami.io/node-nvidia-register": hami_node_register([gpu])}}},
        _content_type=MERGE_PATCH,
    )
    exporter.set_metrics(hami_metrics([gpu]), "/hami")  # vGPUmonitor only: no device total
    prom.wait_for_series(f'hami_vgpu_memory_used_bytes{{namespace="{ns}"}}', timeout=30)
    await reset_nats(nats_url)
    service = _service(nats_url, prom, kube_admin, job="hami")
    async with running(service):
        await wait_for(lambda: _published(service) >= 1, timeout=30)
    (sample, *_) = sorted(await _samples(nats_url), key=lambda s: s.timestamp, reverse=True)
    assert sample.pod == "tts-0"
    assert sample.memory_total_bytes == 23_034 * MIB
    assert sample.compute == pytest.approx(0.35)
    assert sample.memory_used_bytes == 7_000 * MIB


CUDA_OOM_TAIL = (
    "Traceback (most recent call last):\n"
    '  File "/app/train.py", line 140, in step\n'
    "    loss.backward()\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 2.31 GiB is free. Process 1 has 76.84 GiB memory in use.\n"
)
# (reason, exit code, message) of the last termination: the kernel's kill, and a CUDA OOM crash
# whose log tail the kubelet put in the message (terminationMessagePolicy FallbackToLogsOnError)
ENDINGS = {
    "oom-killed": ("OOMKilled", 137, None),
    "cuda-out-of-memory": ("Error", 1, CUDA_OOM_TAIL),
}


def _oom_killed(at: datetime, ending: str) -> dict[str, object]:
    """A container status as the kubelet writes it after an OOM and a restart."""
    reason, code, message = ENDINGS[ending]
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    terminated: dict[str, object] = {
        "exitCode": code,
        "reason": reason,
        "startedAt": (at - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "finishedAt": stamp,
        "containerID": "containerd://1",
    }
    if message is not None:
        terminated["message"] = message
    return {
        "name": "main",
        "image": "registry.invalid/inference:1",
        "imageID": "",
        "containerID": "containerd://2",
        "ready": True,
        "started": True,
        "restartCount": 1,
        "state": {"running": {"startedAt": stamp}},
        "lastState": {"terminated": terminated},
    }


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_an_oom_kill_is_one_signal_and_the_engine_upsizes_on_it(
    ending: str,
    nats_url: str,
    prom: PrometheusServer,
    exporter: GpuTestExporter,
    kube_admin: client.ApiClient,
    kube_namespace: str,
) -> None:
    ns = kube_namespace
    uuid = f"GPU-{ns}-0000-4000-8000-000000000oom"
    core = client.CoreV1Api(kube_admin)
    running_pod(core, ns, "trainer-0", NODE, labels={"app": "trainer"}, annotations=None)
    pod = PodOnGpu(ns, "trainer-0", "main", util_pct=60, memory_used_mib=70_000)
    gpu = GpuState(uuid, NODE, "NVIDIA A100-SXM4-80GB", 81_920, util_pct=60, pods=[pod])
    exporter.set_metrics(dcgm_device_metrics([gpu]), "/dcgm")
    prom.wait_for_series(f'DCGM_FI_DEV_FB_USED{{exported_namespace="{ns}"}}', timeout=30)
    await reset_nats(nats_url)
    workload = WorkloadRef(cluster="test", namespace=ns, owner_kind="Pod", owner_name="trainer-0")
    await put_allocations(
        nats_url,
        Allocation(
            workload=workload,
            pod="trainer-0",
            node=NODE,
            gpu_uuid=uuid,
            fraction=0.5,
            device_memory_bytes=81_920 * MIB,
            updated_at=datetime.now(UTC),
        ),
    )
    service = _service(nats_url, prom, kube_admin)
    async with running(service):
        await wait_for(lambda: _published(service) >= 2, timeout=30)
        assert not any(_oom(s, ns) for s in await _samples(nats_url))
        core.patch_namespaced_pod_status(
            "trainer-0",
            ns,
            {"status": {"containerStatuses": [_oom_killed(datetime.now(UTC), ending)]}},
            _content_type=MERGE_PATCH,
        )
        deadline = time.monotonic() + 20
        while not any(_oom(s, ns) for s in await _samples(nats_url)):
            assert time.monotonic() < deadline, "no OOM signal"
            await asyncio.sleep(0.2)
        published = _published(service)
        await wait_for(lambda: _published(service) >= published + 2, timeout=15)
    events = [s for s in await _samples(nats_url) if _oom(s, ns)]
    assert len(events) == 1  # one kill, one event, though the last state stays
    _, decision = decide(WorkloadState(current_fraction=0.5), events[0], Policy())
    assert decision is not None
    assert decision.reason is ReasonCode.OOM_SIGNAL
    assert decision.new_fraction > 0.5


def _oom(sample: UsageSample, namespace: str) -> bool:
    """An OOM signal of this test's pod (an earlier test's killed pod, still in the cluster
    and in Prometheus' recent data, signals in its own namespace)."""
    return sample.workload.namespace == namespace and bool(
        sample.signals and sample.signals.oom_event
    )
