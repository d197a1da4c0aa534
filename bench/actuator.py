"""Actuator throughput and latency: decisions on NATS to pod patches on a real kube-apiserver.

Usage: python bench/actuator.py [--pods 200] [--decisions 200] [--rate 20]
                                [--executor in-place|backend|all] [--no-inventory-cache]
                                [--real-stack [--pairs 4]]

Starts an embedded nats-server and a real etcd + kube-apiserver (tests/k8s_control_plane.py;
the binaries must be built once: ``make k8s-testbin``), writes a KAI cluster as controllers
would leave it (GPU nodes, KAI's reservation pods naming each GPU, Deployments with one pod
each holding ``gpu-fraction: 0.5``), then times:

1. raw: the same number of merge patches of a pod's annotations, straight from the client in a
   loop, no NATS: the floor of any actuator;
2. backlog: every decision published first, then consumed by a durable pull consumer (the
   service's ``Bus.consume``) and applied one at a time, as the service does: decisions/s;
3. paced: decisions published at ``--rate`` per second (at most half of what the backlog run
   sustained, so that no queue builds up) while they are applied: the time from the decision
   going onto NATS to the patch accepted by the apiserver, p50 and p99.

What applies one decision is an :class:`Executor`, chosen with ``--executor``:

- ``in-place``: :func:`apply_in_place`, the two calls of the in-place plan: a merge patch of the
  pod's ``gpu-fraction`` annotation (with ``fracpilot.io/resized-at`` and the decision id) and
  a core/v1 Event on the pod;
- ``backend``: ``fracpilot_actuator.kube.backend.KubernetesBackend.actuate``, the actuator's
  whole path per decision: nodes, pods and owners from its watch-fed inventory cache (listed
  per decision with ``--no-inventory-cache``), read the workload, plan, check the guardrails,
  record the target in NATS KV, then the same patch and Event (the patch is accepted when
  ``actuate`` returns, one Event later). Listed when that module imports.

``--real-stack`` then also runs the actuator service (and its webhook) against the real GPU
scheduling stack (tests/support/gpu_stack.py: KAI-Scheduler, kwok, kube-scheduler,
kube-controller-manager; built once by ``make gpu-stack-testbin``): ``--pairs`` GPUs each
shared by two 0.5 Deployments, as many empty GPUs on a second node; for each pair one in-place
downsize (0.5 -> 0.25) and one upsize that no longer fits (0.5 -> 0.8: recreated elsewhere),
all published at once. Printed: decisions/s (all decisions done) and decision -> Running p50/p99
per plan kind: in place, the result applied (the pod keeps running, KAI re-reads the
annotation); recreate, the ReplicaSet's new pod, sized by the webhook, bound by KAI, Running.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    Direction,
    FractionDecision,
    ReasonCode,
    WorkloadRef,
    utcnow,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.embedded import EmbeddedNats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from k8s_control_plane import ControlPlane, k8s_version
from support import kube

MERGE_PATCH = "application/merge-patch+json"
CLUSTER = "bench"
GPU_MEMORY_MIB = 81920
GPUS_PER_NODE = 8
HIGH, LOW = 0.5, 0.25  # each decision flips a workload between these


# --- what applies one decision -------------------------------------------------------------------


def apply_in_place(core: client.CoreV1Api, decision: FractionDecision, instance: str) -> float:
    """The in-place plan's calls for one KAI pod; returns when (monotonic) the patch was accepted.

    The same two calls as ``StepExecutor.resize_in_place``: a merge patch of the pod's
    annotations, then a core/v1 Event saying what changed and why.
    """
    ns, pod, now = decision.workload.namespace, decision.pod, utcnow()
    annotations = {
        "gpu-fraction": f"{decision.new_fraction:g}",
        "fracpilot.io/resized-at": now.isoformat(),
        "fracpilot.io/decision-id": decision.decision_id,
    }
    patched = core.patch_namespaced_pod(
        pod, ns, {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH
    )
    accepted = time.monotonic()
    assert patched.metadata is not None
    core.create_namespaced_event(
        ns,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{pod}.{uuid.uuid4().hex[:10]}", namespace=ns),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod, namespace=ns, uid=patched.metadata.uid
            ),
            reason="FractionResized",
            message=(
                f"GPU share {decision.current_fraction:g} -> {decision.new_fraction:g} "
                f"(decision {decision.decision_id})"
            ),
            type="Normal",
            source=client.V1EventSource(component="fracpilot-actuator"),
            reporting_component="fracpilot.io/actuator",
            reporting_instance=instance,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        ),
    )
    return accepted


class Executor(Protocol):
    name: str

    async def apply(self, decision: FractionDecision) -> float:
        """Apply one decision; the monotonic time its patch was accepted."""
        ...


class InPlaceExecutor:
    name = "in-place"

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)

    async def apply(self, decision: FractionDecision) -> float:
        return await asyncio.to_thread(apply_in_place, self.core, decision, "bench")


class BackendExecutor:
    """The actuator's Kubernetes backend, as the service calls it for each decision."""

    name = "backend"

    def __init__(
        self, api: client.ApiClient, bus: Bus, selector: str, inventory_cache: bool = True
    ) -> None:
        self.api, self.bus, self.selector = api, bus, selector
        self.inventory_cache = inventory_cache
        self.outcomes: dict[str, int] = {}
        self._backend: Any = None

    async def start(self) -> None:
        from fracpilot_actuator.guardrails import GuardrailSettings
        from fracpilot_actuator.kube.api import KubeApi
        from fracpilot_actuator.kube.backend import KubernetesBackend
        from fracpilot_actuator.kube.settings import KubeBackendSettings
        from fracpilot_actuator.settings import OptInSettings
        from fracpilot_actuator.stores.nats_kv import KvTargetStore

        async def report(*_: object) -> None:
            return None

        self._backend = KubernetesBackend(
            KubeApi(self.api),
            KvTargetStore(await self.bus.kv(subjects.TARGET_BUCKET)),
            KubeBackendSettings(
                cluster=CLUSTER,
                node_selector=self.selector,
                guardrails=GuardrailSettings(allow_single_replica=True),
                inventory_cache=self.inventory_cache,
                opt_in=OptInSettings(default_mode="auto"),  # the bench's cluster opts in
            ),
            report,
            instance="bench",
        )
        await self._backend.start(utcnow())

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()  # the inventory cache's watches

    async def apply(self, decision: FractionDecision) -> float:
        actuation = await self._backend.actuate(decision, dry_run="", now=utcnow())
        accepted = time.monotonic()
        outcome = str(actuation.outcome.value)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return accepted


def backend_available() -> str | None:
    """None when the actuator's Kubernetes backend imports, else why not."""
    try:
        import fracpilot_actuator.kube.backend  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


# --- the cluster ---------------------------------------------------------------------------------


@dataclass
class Cluster:
    api: client.ApiClient
    namespace: str
    pods: list[str] = field(default_factory=list)
    fraction: dict[str, float] = field(default_factory=dict)  # workload name -> current

    @property
    def selector(self) -> str:
        return f"fracpilot.io/bench={self.namespace}"

    def write(self, workloads: int) -> None:
        """GPU nodes, a reservation pod per GPU and a one-pod Deployment per GPU, as KAI and
        the controllers would leave them (nothing runs them: no kubelet, no scheduler)."""
        core, apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        for ns in (self.namespace, kube.RESERVATION_NS):
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        nodes = (workloads + GPUS_PER_NODE - 1) // GPUS_PER_NODE
        labels = {"fracpilot.io/bench": self.namespace}
        for n in range(nodes):
            kube.gpu_node(
                core,
                f"gpu-{n}",
                GPUS_PER_NODE,
                labels,
                memory_mib=GPU_MEMORY_MIB,
                cpu="64",
                memory="512Gi",
            )
        for i in range(workloads):
            node, group, name = f"gpu-{i // GPUS_PER_NODE}", f"group-{i}", f"svc{i}"
            kube.kai_reservation(core, group, node, f"GPU-{i:08d}")
            owner = kube.deployment(apps, self.namespace, name)
            kube.running_pod(
                core,
                self.namespace,
                f"{name}-0",
                node,
                labels={"app": name, kube.KAI_GROUP: group},
                annotations={"gpu-fraction": f"{HIGH:g}"},
                owner=owner,
                scheduler_name="kai-scheduler",
            )
            self.pods.append(f"{name}-0")
            self.fraction[name] = HIGH

    def next_decision(self, i: int) -> FractionDecision:
        """A decision flipping workload ``i % pods`` between 0.5 and 0.25."""
        pod = self.pods[i % len(self.pods)]
        name = pod.rsplit("-", 1)[0]
        current = self.fraction[name]
        new = LOW if current == HIGH else HIGH
        self.fraction[name] = new
        return FractionDecision(
            decision_id=f"bench-{uuid.uuid4().hex[:16]}",
            workload=WorkloadRef(cluster=CLUSTER, namespace=self.namespace, owner_name=name),
            decided_at=utcnow(),
            pod=pod,
            current_fraction=current,
            new_fraction=new,
            device_memory_bytes=GPU_MEMORY_MIB * 2**20,
            current_memory_mib=int(current * GPU_MEMORY_MIB),
            new_memory_mib=int(new * GPU_MEMORY_MIB),
            memory_need_mib=int(LOW * GPU_MEMORY_MIB) // 2,  # the engine's floor: fits LOW
            direction=Direction.UP if new > current else Direction.DOWN,
            reason=ReasonCode.COMPUTE_HIGH if new > current else ReasonCode.UNDERUSED,
            explanation="bench",
            policy_revision=0,
        )


# --- the measurements ----------------------------------------------------------------------------


@dataclass
class Row:
    path: str
    n: int
    seconds: float
    latencies_s: list[float] = field(default_factory=list)  # empty: not meaningful here
    note: str = ""

    def cells(self) -> str:
        def ms(q: float) -> str:
            if not self.latencies_s:
                return "-"
            ordered = sorted(self.latencies_s)
            return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.1f}"

        return (
            f"{self.path:<38}{self.n:>6}{self.seconds:>9.2f}{self.n / self.seconds:>9.0f}"
            f"{ms(0.5):>9}{ms(0.99):>9}  {self.note}"
        )


def raw_patches(cluster: Cluster, n: int) -> Row:
    """The floor: n annotation patches in a loop, no NATS, no thread hop."""
    core = client.CoreV1Api(cluster.api)
    latencies = []
    start = time.perf_counter()
    for i in range(n):
        pod = cluster.pods[i % len(cluster.pods)]
        t = time.perf_counter()
        core.patch_namespaced_pod(
            pod,
            cluster.namespace,
            {"metadata": {"annotations": {"fracpilot.io/bench": str(i)}}},
            _content_type=MERGE_PATCH,
        )
        latencies.append(time.perf_counter() - t)
    return Row("raw merge patch (no NATS)", n, time.perf_counter() - start, latencies)


ExecutorFactory = Callable[[Bus], Awaitable[Executor]]
"""Makes the executor once the consumer is connected (the backend keeps targets in its KV)."""


async def through_nats(
    nats_url: str, cluster: Cluster, make: ExecutorFactory, n: int, rate: float | None
) -> tuple[Row, Executor]:
    """Publish n decisions (all first, or at ``rate`` per second) and apply each as consumed."""
    settings = ServiceSettings(nats={"url": nats_url})
    consumer = Bus("bench-actuator", settings, CollectorRegistry())
    publisher = Bus("bench-decision", settings, CollectorRegistry())
    await consumer.connect()
    await publisher.connect()
    await consumer.ensure_streams()
    await publisher.js.purge_stream(subjects.DECISION_STREAM)
    executor = await make(consumer)
    sent: dict[str, float] = {}
    latencies: list[float] = []
    done = asyncio.Event()

    async def on_decision(decision: FractionDecision, _msg: Msg) -> None:
        accepted = await executor.apply(decision)
        latencies.append(accepted - sent[decision.decision_id])
        if len(latencies) >= n:
            done.set()

    async def publish(i: int) -> None:
        decision = cluster.next_decision(i)
        sent[decision.decision_id] = time.monotonic()
        await publisher.publish(
            subjects.decision_subject(decision.workload), decision, decision.decision_id
        )

    async def consume() -> None:
        await consumer.consume(
            stream=subjects.DECISION_STREAM,
            durable=f"bench-{uuid.uuid4().hex[:8]}",
            filter_subject=f"{subjects.DECISION_PREFIX}.>",
            model=FractionDecision,
            handler=on_decision,
        )

    if rate is None:  # backlog: everything on NATS first, then drain it
        for i in range(n):
            await publish(i)
        start = time.perf_counter()
        await consume()
        await done.wait()
        row = Row(
            f"NATS -> {executor.name} (backlog)",
            n,
            time.perf_counter() - start,
            note="published first (latency would be queueing)",
        )
    else:
        await consume()
        start = time.perf_counter()
        for i in range(n):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            await publish(i)
        await done.wait()
        row = Row(
            f"NATS -> {executor.name} (paced {rate:g}/s)",
            n,
            time.perf_counter() - start,
            latencies,
            "on NATS -> patch accepted",
        )
    await consumer.close()
    await publisher.close()
    return row, executor


async def run(
    pods: int, decisions: int, rate: float, which: str, inventory_cache: bool = True
) -> None:
    with EmbeddedNats() as server, ControlPlane() as kube, kube.admin_client() as api:
        cluster = Cluster(api, f"bench-{uuid.uuid4().hex[:6]}")
        start = time.perf_counter()
        cluster.write(pods)
        setup_s = time.perf_counter() - start
        rows = [raw_patches(cluster, decisions)]
        notes = []

        async def in_place(_bus: Bus) -> Executor:
            return InPlaceExecutor(api)

        async def backend(bus: Bus) -> Executor:
            executor = BackendExecutor(api, bus, cluster.selector, inventory_cache)
            await executor.start()
            return executor

        factories: list[ExecutorFactory] = []
        if which in ("in-place", "all"):
            factories.append(in_place)
        if which in ("backend", "all"):
            if (missing := backend_available()) is None:
                factories.append(backend)
            else:
                notes.append(f"backend executor not available: {missing}")
        for make in factories:
            backlog, executor = await through_nats(server.url, cluster, make, decisions, None)
            getattr(executor, "close", lambda: None)()
            # Paced below what the path sustains (half of it at most), or the latency measured
            # would be the queue's.
            capacity = decisions / backlog.seconds
            paced, paced_executor = await through_nats(
                server.url, cluster, make, decisions, round(min(rate, capacity / 2), 1)
            )
            getattr(paced_executor, "close", lambda: None)()
            rows += [backlog, paced]
            outcomes = getattr(executor, "outcomes", None)
            if outcomes is not None and outcomes != {"applied": decisions}:
                notes.append(f"{backlog.path}: outcomes {outcomes}")

    print(
        f"kube-apiserver {k8s_version()} + etcd on loopback, embedded nats-server; "
        f"{pods} KAI pods on {(pods + GPUS_PER_NODE - 1) // GPUS_PER_NODE} nodes "
        f"(written in {setup_s:.1f} s); decisions applied one at a time"
    )
    print(f"{'path':<38}{'n':>6}{'seconds':>9}{'per s':>9}{'p50 ms':>9}{'p99 ms':>9}")
    for row in rows:
        print(row.cells())
    for note in notes:
        print(note)


# --- against the real GPU scheduling stack (--real-stack) ----------------------------------------


def _pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


async def real_stack(pairs: int) -> None:
    """Resize decisions through the actuator service on KAI; see the module docstring."""
    import tempfile

    from fracpilot_libs.contracts import ActuationResult, PlanKind
    from support.fracpilot_on_stack import (
        actuator_on_stack,
        decide,
        in_thread,
        kai_deployment,
        publish,
        results,
        running_pods,
        wait_running,
    )
    from support.gpu_stack import GpuStack, ensure_gpu_stack_testbin

    workdir = Path(tempfile.mkdtemp(prefix="fracpilot-bench-"))
    bin_dir = ensure_gpu_stack_testbin()
    with EmbeddedNats() as server, ControlPlane() as kube_cp, GpuStack(kube_cp, bin_dir) as stack:
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        stack.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        shared_gpus = pairs
        stack.create_gpu_node(f"kwok-shared-{ns}", gpus=shared_gpus)
        names = [f"w{i}" for i in range(2 * pairs)]
        changes: dict[str, Any] = {"max_disruptions": 1000, "max_disruptions_per_namespace": 1000}
        async with actuator_on_stack(stack, server.url, ns, workdir, **changes):
            for name in names:
                await in_thread(stack.create, kai_deployment(name, "0.5"), ns)
            pods = {}
            for name in names:
                [pod] = await in_thread(wait_running, stack, ns, name, 1, 300)
                pods[name] = pod
            await in_thread(stack.create_gpu_node, f"kwok-spare-{ns}", gpus=pairs)
            # Pair the pods by GPU group: one of each is downsized, the other outgrows it.
            by_group: dict[str, list[str]] = {}
            for name, pod in pods.items():
                by_group.setdefault(pod["metadata"]["labels"]["runai-gpu-group"], []).append(name)
            decisions = []
            for members in by_group.values():
                for i, name in enumerate(sorted(members)):
                    new = 0.25 if i % 2 == 0 else 0.8
                    pod_name = pods[name]["metadata"]["name"]
                    decisions.append(decide(ns, name, pod_name, 0.5, new))
            sent: dict[str, float] = {}
            start = time.monotonic()
            for made in decisions:
                sent[made.decision_id] = await publish(server.url, made)
            done: dict[str, tuple[str, float]] = {}  # decision id -> (plan, seconds)
            seen: dict[str, ActuationResult] = {}
            deadline = start + 600
            while len(done) < len(decisions) and time.monotonic() < deadline:
                for made in decisions:
                    if made.decision_id in seen:
                        continue
                    if found := await results(server.url, made.decision_id):
                        seen[made.decision_id] = found[0]
                now = time.monotonic()
                running = {}
                for made in decisions:
                    result = seen.get(made.decision_id)
                    if result is None or made.decision_id in done:
                        continue
                    name = made.workload.owner_name
                    if result.plan is not PlanKind.RECREATE_ELSEWHERE:
                        done[made.decision_id] = (
                            str(result.plan.value),
                            now - sent[made.decision_id],
                        )
                        continue
                    if name not in running:
                        running[name] = await in_thread(running_pods, stack, ns, name)
                    old = pods[name]["metadata"]["uid"]
                    if any(p["metadata"]["uid"] != old for p in running[name]):
                        done[made.decision_id] = ("recreate", now - sent[made.decision_id])
                await asyncio.sleep(0.2)
            total = time.monotonic() - start
    outcomes: dict[str, int] = {}
    for result in seen.values():
        key = f"{result.plan.value}/{result.outcome.value}"
        outcomes[key] = outcomes.get(key, 0) + 1
    print(
        f"\nreal GPU stack (KAI-Scheduler v0.12.0, kwok, KCM) + actuator service with webhook: "
        f"{len(decisions)} decisions published at once on {2 * pairs} KAI Deployments"
    )
    print(f"{'plan':<22}{'n':>4}{'p50 s':>9}{'p99 s':>9}   (decision on NATS -> Running)")
    for plan in sorted({p for p, _ in done.values()}):
        values = [s for p, s in done.values() if p == plan]
        print(f"{plan:<22}{len(values):>4}{_pct(values, 0.5):>9}{_pct(values, 0.99):>9}")
    print(
        f"all done: {len(done)}/{len(decisions)} in {total:.1f} s = "
        f"{len(done) / total:.2f} decisions/s; results: {outcomes}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200, help="KAI workloads (one pod each)")
    parser.add_argument("--decisions", type=int, default=200, help="per measured path")
    parser.add_argument("--rate", type=float, default=20.0, help="decisions/s when paced")
    parser.add_argument("--executor", choices=("in-place", "backend", "all"), default="all")
    parser.add_argument(
        "--real-stack",
        action="store_true",
        help="also run resize decisions through the actuator on the real KAI stack",
    )
    parser.add_argument("--pairs", type=int, default=4, help="--real-stack: shared GPUs")
    parser.add_argument(
        "--no-inventory-cache",
        action="store_true",
        help="backend: list nodes, pods and owners per decision (inventory_cache=False)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("fracpilot_libs.nats.bus").setLevel(logging.ERROR)  # "disconnected" at close
    if args.executor in ("backend", "all") and args.decisions > args.pods:
        # The backend's stale guard refuses a decision made before the workload's last
        # change; published in a backlog, a second decision per workload would be.
        parser.error("--decisions must not exceed --pods with the backend executor")
    asyncio.run(
        run(args.pods, args.decisions, args.rate, args.executor, not args.no_inventory_cache)
    )
    if args.real_stack:
        asyncio.run(real_stack(args.pairs))


if __name__ == "__main__":
    main()
