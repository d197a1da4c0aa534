"""Accounted versus enforced shares: detection from the pod (and its KAI ConfigMap), and the
judge's honest "in place" (kube/enforcement.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import decision, workload
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import Disruption, GuardrailSettings, GuardState
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.enforcement import (
    NOT_ENFORCED,
    Enforcement,
    configmaps_of,
    enforcement_map,
    enforcement_note,
    enforcement_of,
    honest_step,
    lags,
    must_recreate,
    parse_memory_limit,
)
from fracpilot_actuator.kube.inventory import PodInfo, build_inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan, Skip
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.settings import OptInSettings
from fracpilot_actuator.stores.memory import MemoryAllocationStore, MemoryTargetStore
from fracpilot_libs.contracts import EnforcementMode, FractionDecision, Outcome, PlanKind
from fracpilot_libs.placement.planner import ResizePlan
from support.kube_objects import MEM_MIB, T0, hami, kai, node, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
OWNER = ("Deployment", "chat")
LATER = T0 + timedelta(minutes=5)
NOW = T0 + timedelta(minutes=6)
GUARDS = Guards(GuardState(), GuardrailSettings())
OPTED_IN = {"fracpilot.io/mode": "auto"}
PREFIX = "chat-abcdefg-shared-gpu"  # KAI's runai/shared-gpu-configmap: <owner>-<7 rand>-shared-gpu


def hamicore(pod: dict[str, Any], container: int = 0) -> dict[str, Any]:
    """The pod as KAI's admission leaves it with the hamicore plugin: the fraction container's
    CUDA_DEVICE_MEMORY_LIMIT is a configMapKeyRef on <prefix>-<index> (optional)."""
    pod["metadata"]["annotations"]["runai/shared-gpu-configmap"] = PREFIX
    ref = {"name": f"{PREFIX}-{container}", "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": True}
    env = [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": ref}}]
    pod["spec"]["containers"][container]["env"] = env
    return pod


def kai_pods(*fractions: str, enforced: bool = True) -> list[dict[str, Any]]:
    pods = [kai(f"chat-{i}", f, group="g1", owner=OWNER) for i, f in enumerate(fractions)]
    return [hamicore(p) for p in pods] if enforced else pods


def limit_cm(mib: int | None) -> dict[str, dict[str, str] | None]:
    """The capabilities ConfigMap as the binder filled it (``GPU_PORTION`` always; the limit
    with the hamicore binder plugin)."""
    data = {"GPU_PORTION": "0.50", "NVIDIA_VISIBLE_DEVICES": UUID_A}
    if mib is not None:
        data["CUDA_DEVICE_MEMORY_LIMIT"] = f"{mib}m"
    return {f"{PREFIX}-0": data}


def view(
    *pods: dict[str, Any], configmaps: Mapping[str, Mapping[str, str] | None] | None = None
) -> ClusterView:
    inventory = build_inventory(
        [node("n1", gpus=1)],
        [reservation("g1", UUID_A), *pods],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    mine = inventory.pods_of(workload("chat"), {})
    enforcement = enforcement_map(mine, inventory, configmaps or {}, MEM_MIB)
    return ClusterView(inventory, mine, None, OPTED_IN, enforcement=enforcement)


def change(current: float, new: float, **kw: Any) -> FractionDecision:
    return decision(current, new, name="chat", **{"decided_at": LATER, **kw})


def one(p: dict[str, Any]) -> PodInfo:
    return next(iter(view(p).live))


# --- detection --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("40960m", 40960),
        ("40g", 40960),
        ("40G", 40960),
        ("1048576k", 1024),
        ("1073741824", 1024),
        ("0", None),  # HAMi-core: 0 is unlimited
        ("0m", None),  # in any unit
        ("0g", None),
        ("0k", None),
        ("512k", 1),  # a limit under a MiB still limits: never read as "unlimited"
    ],
)
def test_memory_limits_parse_as_hami_core_reads_them(text: str, mib: int | None) -> None:
    assert parse_memory_limit(text) == mib


@pytest.mark.parametrize("text", ["", "lots", "40x", "-1m", "1.5g"])
def test_a_memory_limit_that_is_no_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_memory_limit(text)


def test_a_kai_pod_without_the_hamicore_env_is_accounting_only() -> None:
    pod = one(kai("chat-0", "0.5", group="g1", owner=OWNER))
    assert configmaps_of(pod) == ()
    assert enforcement_of(pod, {}, MEM_MIB) == NOT_ENFORCED
    assert not NOT_ENFORCED.enforced
    assert "KAI without HAMi-core" in NOT_ENFORCED.describe()


def test_a_kai_hamicore_pod_is_held_to_the_limit_its_configmap_gave_it() -> None:
    pod = one(hamicore(kai("chat-0", "0.25", group="g1", owner=OWNER)))
    assert configmaps_of(pod) == (f"{PREFIX}-0",)
    e = enforcement_of(pod, limit_cm(40960), MEM_MIB)
    assert (e.memory_mib, e.fraction, e.unknown) == (40960, 0.5, False)
    assert "CUDA_DEVICE_MEMORY_LIMIT=40960m" in e.describe()
    assert f"ConfigMap {PREFIX}-0" in e.describe()
    # The binder without the hamicore plugin leaves the (optional) key out: nothing enforced.
    assert not enforcement_of(pod, limit_cm(None), MEM_MIB).enforced
    # A ConfigMap that could not be read: unknown, not "not enforced".
    unread = enforcement_of(pod, {f"{PREFIX}-0": None}, MEM_MIB)
    assert unread.unknown
    assert not unread.enforced


def test_the_fraction_container_is_the_one_kai_names() -> None:
    raw = kai("chat-0", "0.25", group="g1", owner=OWNER)
    raw["spec"]["containers"].insert(0, {"name": "sidecar"})
    raw["metadata"]["annotations"]["gpu-fraction-container-name"] = "main"
    raw = hamicore(raw, container=1)
    pod = one(raw)
    assert configmaps_of(pod) == (f"{PREFIX}-1",)
    data = {f"{PREFIX}-1": {"CUDA_DEVICE_MEMORY_LIMIT": "20480m"}}
    assert enforcement_of(pod, data, MEM_MIB).fraction == 0.25
    raw["metadata"]["annotations"].pop("gpu-fraction-container-name")  # default: the first
    assert enforcement_of(one(raw), data, MEM_MIB) == NOT_ENFORCED


def test_the_fraction_container_may_be_an_init_container() -> None:
    # A native sidecar (an init container with restartPolicy Always) named by KAI's annotation:
    # KAI's hamicore webhook adds the env there, its ConfigMap suffixed i<index>.
    raw = kai("chat-0", "0.25", group="g1", owner=OWNER)
    ref = {"name": f"{PREFIX}-i0", "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": True}
    env = [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": ref}}]
    raw["spec"]["initContainers"] = [{"name": "server", "restartPolicy": "Always", "env": env}]
    raw["metadata"]["annotations"]["gpu-fraction-container-name"] = "server"
    pod = one(raw)
    assert configmaps_of(pod) == (f"{PREFIX}-i0",)
    data = {f"{PREFIX}-i0": {"CUDA_DEVICE_MEMORY_LIMIT": "20480m"}}
    assert enforcement_of(pod, data, MEM_MIB).fraction == 0.25


def test_a_literal_limit_in_the_pod_counts_and_zero_is_unlimited() -> None:
    raw = kai("chat-0", "0.25", group="g1", owner=OWNER)
    raw["spec"]["containers"][0]["env"] = [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "20g"}]
    assert enforcement_of(one(raw), {}, MEM_MIB).fraction == 0.25
    for unlimited in ("0", "0m", "0g"):
        raw["spec"]["containers"][0]["env"][0]["value"] = unlimited
        assert not enforcement_of(one(raw), {}, MEM_MIB).enforced


def test_hami_pods_are_held_to_their_allocation_unless_control_is_disabled() -> None:
    raw = hami("chat-0", f"{UUID_A},NVIDIA,20480,0:;", owner=OWNER)
    e = enforcement_of(one(raw), {}, MEM_MIB)
    assert (e.memory_mib, e.fraction) == (20480, 0.25)
    raw["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "True"}]
    assert not enforcement_of(one(raw), {}, MEM_MIB).enforced


# --- the judge --------------------------------------------------------------------------------


def test_an_upsize_past_an_enforced_limit_is_a_recreate_never_an_in_place_patch() -> None:
    pods = kai_pods("0.25", "0.25")
    configmaps = {f"{PREFIX}-0": {"CUDA_DEVICE_MEMORY_LIMIT": "20480m"}}
    result = judge(change(0.25, 0.38), view(*pods, configmaps=configmaps), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.RECREATE_ELSEWHERE
    assert {s.kind for s in result.plan.steps} == {PlanKind.RECREATE_ELSEWHERE}
    assert "moves only KAI's accounting" in result.plan.reason
    assert result.disruptive
    applied = result.result(Outcome.APPLIED, "done")
    assert (applied.fraction_after, applied.enforced_fraction) == (0.38, 0.38)
    before = result.result(Outcome.FAILED, "no", "no")
    assert before.enforced_fraction == 0.25  # not done: the container's limit as it is


def test_an_upsize_without_enforcement_or_within_the_limit_stays_in_place() -> None:
    free = judge(change(0.25, 0.38), view(*kai_pods("0.25", enforced=False)), GUARDS, NOW)
    assert isinstance(free, ActuationPlan)
    assert free.plan.kind is PlanKind.IN_PLACE
    assert "memory not enforced" in free.plan.reason
    assert free.result(Outcome.APPLIED, "done").enforced_fraction is None
    # Downsized in place earlier: accounted 0.25, the container still holds 0.5.
    covered = judge(
        change(0.25, 0.38), view(*kai_pods("0.25"), configmaps=limit_cm(40960)), GUARDS, NOW
    )
    assert isinstance(covered, ActuationPlan)
    assert covered.plan.kind is PlanKind.IN_PLACE
    assert "its enforced limit covers it" in covered.plan.reason
    assert covered.result(Outcome.APPLIED, "done").enforced_fraction == 0.5


def test_a_downsize_in_place_needs_the_memory_floor_under_the_new_accounting() -> None:
    pods = view(*kai_pods("0.5"), configmaps=limit_cm(40960))
    unknown = judge(change(0.5, 0.25, memory_need_mib=None), pods, GUARDS, NOW)
    assert isinstance(unknown, Skip)
    assert "carries no memory need" in unknown.actuation.detail
    above = judge(change(0.5, 0.25, memory_need_mib=24576), pods, GUARDS, NOW)  # 0.3 of 80 GiB
    assert isinstance(above, Skip)
    assert "memory need 0.3 (peak + headroom) is above it" in above.actuation.detail
    fits = judge(change(0.5, 0.25, memory_need_mib=16384), pods, GUARDS, NOW)  # 0.2
    assert isinstance(fits, ActuationPlan)
    assert fits.plan.kind is PlanKind.IN_PLACE
    assert "memory need 0.2 (peak + headroom) stays under the new 0.25" in fits.plan.reason
    assert "enforced limit stays 0.5 until the pod restarts" in fits.plan.reason
    done = fits.result(Outcome.APPLIED, fits.plan.reason)
    assert (done.fraction_after, done.enforced_fraction) == (0.25, 0.5)  # the lag, reported


def test_recreate_within_budget_converges_when_the_budget_allows_else_it_lags() -> None:
    pods = view(*kai_pods("0.5"), configmaps=limit_cm(40960))
    made = change(
        0.5, 0.25, memory_need_mib=16384, enforcement=EnforcementMode.RECREATE_WITHIN_BUDGET
    )
    single = GuardrailSettings(allow_single_replica=True)
    converged = judge(made, pods, Guards(GuardState(), single), NOW)
    assert isinstance(converged, ActuationPlan)
    assert converged.plan.kind is PlanKind.RECREATE_ELSEWHERE
    assert "recreate_within_budget" in converged.plan.reason
    assert converged.result(Outcome.APPLIED, "").enforced_fraction == 0.25
    full = GuardState(recent=tuple(Disruption(f"w{i}", "other", NOW) for i in range(5)))
    lagging = judge(made, pods, Guards(full, single), NOW)
    assert isinstance(lagging, ActuationPlan)
    assert lagging.plan.kind is PlanKind.IN_PLACE  # out of budget: at the next restart
    # A single replica may not be recreated by default: it lags, still resized in place.
    guarded = judge(made, pods, GUARDS, NOW)
    assert isinstance(guarded, ActuationPlan)
    assert guarded.plan.kind is PlanKind.IN_PLACE


def test_a_scale_up_moves_in_place_only_within_the_enforced_limit() -> None:
    up = change(0.25, 0.5)
    assert must_recreate(Enforcement(20480, 0.25, "x"), up)
    assert not must_recreate(Enforcement(40960, 0.5, "x"), up)
    assert not must_recreate(NOT_ENFORCED, up)
    assert must_recreate(Enforcement(how="unread", unknown=True), up)
    assert not must_recreate(Enforcement(20480, 0.25, "x"), change(0.5, 0.25))


# --- the property -----------------------------------------------------------------------------

shares = st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.5, 0.75, 0.9])
enforcements = st.one_of(
    st.just(NOT_ENFORCED),
    st.just(Enforcement(how="unread", unknown=True)),
    shares.map(lambda f: Enforcement(round(f * MEM_MIB), f, "limit")),
)


@settings(max_examples=200, deadline=None)
@given(
    before=shares,
    after=shares,
    e=enforcements,
    floor=st.one_of(st.none(), st.floats(0.0, 1.0)),
    kind=st.sampled_from(list(PlanKind)),
)
def test_in_place_never_promises_memory_the_container_cannot_use_nor_takes_memory_it_uses(
    before: float, after: float, e: Enforcement, floor: float | None, kind: PlanKind
) -> None:
    step = ResizePlan(
        kind=kind,
        workload=workload("chat"),
        pod="chat-0",
        fraction_before=before,
        fraction_after=after,
        gpu_before=UUID_A,
        gpu_after=UUID_A,
        reason="planned",
    )
    out = honest_step(step, e, floor)
    if kind is not PlanKind.IN_PLACE:
        assert out == step  # only in-place steps are looked at
        return
    if isinstance(out, str):  # a refusal: only of a downsize the floor does not allow
        assert after <= before
        assert floor is None or floor > after
        return
    assert (out.fraction_before, out.fraction_after, out.gpu_after) == (before, after, UUID_A)
    if out.kind is PlanKind.IN_PLACE:
        if after > before:  # an upsize in place: the container may already use it
            assert not e.unknown
            assert e.fraction is None or e.fraction >= after - 1e-6
        else:  # a downsize in place: what it uses fits under the new accounting
            assert floor is not None
            assert floor <= after + 1e-6
    else:
        assert out.kind is PlanKind.RECREATE_ELSEWHERE
        assert after > before
        assert e.unknown or (e.fraction is not None and e.fraction < after)


# --- the backend, on an API answering from fixed objects --------------------------------------


class FixedApi:
    """Answers from fixed nodes, pods and ConfigMaps; records writes (and ConfigMap reads)."""

    def __init__(self, pods: list[dict[str, Any]], configmaps: dict[str, dict[str, str]]) -> None:
        self.pods = [reservation("g1", UUID_A), *pods]
        self.configmaps = configmaps
        self.calls: list[tuple[str, str]] = []

    async def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return [node("n1", gpus=1)]

    async def list_pods(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return [] if label_selector else self.pods

    async def list_owners(self, namespace: str) -> tuple[list[Any], list[Any]]:
        return [], []

    async def read_owner(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace}}

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        self.calls.append(("read_configmap", name))
        return self.configmaps.get(name)

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str], **_: str
    ) -> int:
        self.calls.append(("patch", name))
        stored = next(p for p in self.pods if p["metadata"]["name"] == name)
        stored["metadata"]["annotations"].update(annotations)
        return 2

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods if p["metadata"]["name"] == name), None)

    async def evict(self, namespace: str, name: str) -> None:
        self.calls.append(("evict", name))

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append((f"event:{body['reason']}", str(body["message"])))


def test_an_in_place_downsize_publishes_the_lag_in_the_result_event_and_allocation() -> None:
    api = FixedApi(kai_pods("0.5"), {f"{PREFIX}-0": {"CUDA_DEVICE_MEMORY_LIMIT": "40960m"}})
    allocations = MemoryAllocationStore()

    async def report(_decision: FractionDecision, _actuation: Actuation) -> None:
        return None

    backend = KubernetesBackend(
        cast(KubeApi, api),
        MemoryTargetStore(),
        KubeBackendSettings(
            cluster="test", inventory_cache=False, opt_in=OptInSettings(default_mode="auto")
        ),
        report,
        instance="unit",
        allocations=allocations,
    )

    async def run() -> Actuation:
        await backend.start(T0)
        return await backend.actuate(change(0.5, 0.25, memory_need_mib=16384), dry_run="", now=NOW)

    result = asyncio.run(run())
    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED)
    assert (result.fraction_after, result.enforced_fraction) == (0.25, 0.5)
    assert ("read_configmap", f"{PREFIX}-0") in api.calls
    assert ("patch", "chat-0") in api.calls
    [message] = [m for c, m in api.calls if c == "event:FractionResized"]
    assert "accounted 0.25; enforced 0.5 (CUDA_DEVICE_MEMORY_LIMIT=40960m" in message
    assert "(lags until the pod restarts)" in message
    [allocation] = allocations.allocations.values()
    assert (allocation.fraction, allocation.enforced_fraction) == (0.25, 0.5)


# --- precision: limits in MiB with KAI's rounding (issue 26) ----------------------------------

A100_LABEL = 81559  # nvidia.com/gpu.memory of an A100 80GB: 0.5 of it is not a whole MiB


def as_kai_admits(pod: dict[str, Any], container: int = 0) -> dict[str, Any]:
    """The pod exactly as KAI's admission leaves it with gpu-sharing and hamicore on
    (kai-scheduler/KAI-Scheduler d5bc503a146317e51037d89775d77172c6d12f71):
    ``pkg/admission/webhook/v1alpha2/gpusharing/gpu_sharing.go`` ``Mutate`` sets the
    ``runai/shared-gpu-configmap`` prefix, adds NVIDIA_VISIBLE_DEVICES, RUNAI_NUM_OF_GPUS and
    GPU_PORTION from ``<prefix>-<index>`` (``common.AddGPUSharingEnvVars``), its volume
    (``SetConfigMapVolume``: ``<cm>-vol``) and ``envFrom`` ``<cm>-evar`` (optional false); then
    ``pkg/admission/webhook/v1alpha2/hamicore/hamicore.go`` ``Mutate`` adds
    CUDA_DEVICE_MEMORY_LIMIT from the same ConfigMap, optional."""
    pod["metadata"]["annotations"]["runai/shared-gpu-configmap"] = PREFIX
    cm = f"{PREFIX}-{container}"

    def ref(key: str, **extra: Any) -> dict[str, Any]:
        return {"name": key, "valueFrom": {"configMapKeyRef": {"key": key, "name": cm, **extra}}}

    target = pod["spec"]["containers"][container]
    target["env"] = [
        *(target.get("env") or []),
        ref("NVIDIA_VISIBLE_DEVICES"),
        ref("RUNAI_NUM_OF_GPUS"),
        ref("GPU_PORTION"),
        ref("CUDA_DEVICE_MEMORY_LIMIT", optional=True),
    ]
    target["envFrom"] = [{"configMapRef": {"name": f"{cm}-evar", "optional": False}}]
    pod["spec"]["volumes"] = [{"name": f"{cm}-vol", "configMap": {"name": cm}}]
    return pod


def bound_cm(label_mib: int, portion: str) -> dict[str, dict[str, str] | None]:
    """The capabilities ConfigMap once KAI's binder bound the pod: GPU_PORTION and
    RUNAI_NUM_OF_GPUS (``SetGPUPortion``), and ``pkg/binder/plugins/hamicore/hami_core.go``
    ``calculateCudaDeviceMemoryLimit``: int64(float64(label) * portion) + "m"."""
    limit = int(float(label_mib) * float(portion))
    data = {
        "GPU_PORTION": portion,
        "RUNAI_NUM_OF_GPUS": portion,
        "NVIDIA_VISIBLE_DEVICES": UUID_A,
        "CUDA_DEVICE_MEMORY_LIMIT": f"{limit}m",
    }
    return {f"{PREFIX}-0": data}


def a100_view(fraction: str, configmaps: Mapping[str, Mapping[str, str] | None]) -> ClusterView:
    pod = as_kai_admits(kai("chat-0", fraction, group="g1", owner=OWNER))
    inventory = build_inventory(
        [node("n1", gpus=1, memory_mib=A100_LABEL)],
        [reservation("g1", UUID_A), pod],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    mine = inventory.pods_of(workload("chat"), {})
    enforcement = enforcement_map(mine, inventory, configmaps, MEM_MIB)
    return ClusterView(inventory, mine, None, OPTED_IN, enforcement=enforcement)


def test_kais_limit_is_read_as_the_share_it_was_computed_from() -> None:
    view_ = a100_view("0.5", bound_cm(A100_LABEL, "0.50"))
    e = view_.enforcement["chat-0"]
    assert e.memory_mib == 40779  # int(81559 * 0.5): 0.499994 of the GPU
    assert e.fraction == 0.5, "today: 0.499994, reported as the enforced fraction"
    assert e.covers(0.5)
    assert e.matches(0.5)
    assert not e.covers(0.51)
    by_hand = enforcement_of(
        one(as_kai_admits(kai("chat-0", "0.5", owner=OWNER))), {f"{PREFIX}-0": {}}, 0
    )
    assert not by_hand.enforced  # the binder wrote no limit: accounting only


def test_an_upsize_back_to_the_starting_share_stays_in_place() -> None:
    # Started at 0.5 (limit 40779 MiB), downsized in place to 0.25; back to 0.5.
    view_ = a100_view("0.25", bound_cm(A100_LABEL, "0.50"))
    result = judge(change(0.25, 0.5), view_, GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.IN_PLACE, "today: a needless recreate (0.499994 < 0.5)"
    assert "its enforced limit covers it" in result.plan.reason
    e = view_.enforcement["chat-0"]
    assert not lags(result.plan.steps[0], e), "today: flagged as lagging"
    assert "lags" not in enforcement_note(result.plan.steps[0], e)
    assert result.result(Outcome.APPLIED, "").enforced_fraction == 0.5


@given(
    label=st.integers(1000, 200_000),
    started=st.integers(1, 99),
    target=st.integers(1, 99),
)
@settings(max_examples=300, deadline=None)
def test_a_kai_limit_covers_exactly_the_shares_a_new_container_would_get_no_more(
    label: int, started: int, target: int
) -> None:
    """In MiB: the limit of a container started at ``started`` hundredths holds ``target``
    hundredths iff a container started at ``target`` would get no more memory."""
    portion = f"{started / 100:.2f}"
    e = enforcement_of(
        one(as_kai_admits(kai("chat-0", portion, owner=OWNER))), bound_cm(label, portion), label
    )
    wanted = int(float(label) * float(f"{target / 100:.2f}"))
    assert e.covers(target / 100) == (e.memory_mib is not None and e.memory_mib >= wanted)
    assert e.matches(target / 100) == (e.memory_mib == wanted)
    assert e.matches(started / 100)
