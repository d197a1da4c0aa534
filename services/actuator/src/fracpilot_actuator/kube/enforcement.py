"""Accounted versus enforced GPU share: what a running container is really held to. Pure.

KAI's scheduler re-reads a pod's ``gpu-fraction`` / ``gpu-memory`` annotation on every cycle,
so an in-place change moves its *accounting* at once; the container keeps what it started
with. Its ``GPU_PORTION`` and, with KAI's hamicore plugin, its ``CUDA_DEVICE_MEMORY_LIMIT``
are env vars from the pod's GPU-sharing ConfigMap, filled once by the binder before binding
(kai-scheduler/KAI-Scheduler d5bc503a146317e51037d89775d77172c6d12f71, v0.17.0+9; the plugin
came in 55febaf978ca7ee0744f4ff7cb7ba7bf9aee96f6 and is not in v0.12.0, the only version the Go
module proxy serves, so this path is modelled from that source and tested on pod objects shaped
as it writes them, never on the real stack: ``pkg/admission/webhook/v1alpha2/hamicore/
hamicore.go`` ``Mutate`` adds the env as a ``configMapKeyRef`` on
``<runai/shared-gpu-configmap>-<container index>`` (``i<index>`` for an init container), key
``CUDA_DEVICE_MEMORY_LIMIT``, optional; ``pkg/binder/plugins/hamicore/hami_core.go``
``calculateCudaDeviceMemoryLimit`` writes ``int64(float64(node label nvidia.com/gpu.memory) x
portion)`` + ``m`` into it, the portion being the BindRequest's ``receivedGPU.portion``, which
the scheduler formats ``%.2f`` (``pkg/scheduler/cache/cache.go``); the fraction container is
the one named by ``gpu-fraction-container-name``, else the first:
``pkg/binder/common/gpu_access.go`` ``GetFractionContainerRef``). Without HAMi-core nothing
limits the memory (KAI ``docs/gpu-sharing/README.md``). HAMi's device plugin sets
``CUDA_DEVICE_MEMORY_LIMIT_<i>`` to the allocated MiB at container start unless the container
sets ``CUDA_DISABLE_CONTROL=true`` (Project-HAMi/HAMi 4707fb02:
``pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go`` Allocate); every HAMi resize
is a recreate. HAMi-core reads ``1g`` / ``1024m`` / ``1048576k`` / bytes, 0 = unlimited
(Project-HAMi/HAMi-core ``README.md``). The pod's side of this (the fraction container, its
env, the size) is read by :mod:`fracpilot_actuator.admission.hamicore`, the webhook's reading too.

So (:func:`enforce`, called by the judge on the planner's plan):

- an in-place upsize that must raise an enforced limit is a recreate (the accounting alone
  would promise memory the container cannot use);
- an in-place downsize is allowed only when the engine's memory floor (the decision's
  ``memory_need_mib``: peak + headroom) fits under the new accounting, since the container
  may go on using what it holds (KAI packs a neighbour into the freed share at once);
- with the policy's ``enforcement: recreate_within_budget`` an in-place downsize of an
  enforced pod is a recreate when the disruption budget allows (else it lags until the pod's
  next restart, as with ``next_restart``).

Enforced limits are compared in MiB with KAI's rounding (:func:`kai_limit_mib`), never as
float shares: KAI truncates, so a 0.5 share of an 81559 MiB GPU is held to 40779 MiB, which
reads back as 0.499994 of it, and that limit does hold 0.5 (an upsize back to it stays in
place, and it does not lag).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fracpilot_actuator.admission.hamicore import (
    MEMORY_LIMIT,
    env_var,
    fraction_container,
    parse_memory_limit,
)
from fracpilot_actuator.kube.inventory import Inventory, PodInfo
from fracpilot_actuator.kube.object_values import get_path
from fracpilot_libs.contracts import MIB, EnforcementMode, FractionDecision, GpuSharing, PlanKind
from fracpilot_libs.placement.planner import SEVERITY, ResizePlan, WorkloadPlan

EPS = 1e-6
DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"  # HAMi: "true" leaves HAMi-core out
_TRUE = {"1", "t", "true"}  # strconv.ParseBool's true values, case folded


@dataclass(frozen=True)
class Enforcement:
    """The memory limit a running container is held to, fixed when it started."""

    memory_mib: int | None = None  # None: not enforced (or unknown)
    fraction: float | None = None  # the limit as a share of its GPU
    how: str = ""  # what enforces it (or why nothing does), for the texts
    unknown: bool = False  # the pod refers to a limit that could not be read
    gpu_memory_mib: int = 0  # the GPU memory the limit is a share of (0: unknown)

    @property
    def enforced(self) -> bool:
        return self.fraction is not None

    def limit_for(self, fraction: float) -> int | None:
        """The limit (MiB) a container started at ``fraction`` of this GPU would get."""
        return kai_limit_mib(self.gpu_memory_mib, fraction) if self.gpu_memory_mib > 0 else None

    def covers(self, fraction: float) -> bool:
        """The limit holds a share of ``fraction`` (in MiB, as KAI computes a limit); not
        enforced: True (nothing holds it back)."""
        if self.fraction is None:
            return True
        wanted = self.limit_for(fraction)
        if self.memory_mib is None or wanted is None:
            return self.fraction + EPS >= fraction
        return self.memory_mib >= wanted

    def matches(self, fraction: float) -> bool:
        """The limit is the one a container started at ``fraction`` would get (no lag)."""
        if self.fraction is None:
            return True
        wanted = self.limit_for(fraction)
        if self.memory_mib is None or wanted is None:
            return abs(self.fraction - fraction) <= EPS
        return self.memory_mib == wanted

    def describe(self) -> str:
        if self.unknown:
            return f"enforced limit unknown ({self.how})"
        if self.fraction is None:
            return f"memory not enforced ({self.how or 'no HAMi-core limit'})"
        return f"enforced {_share(self.fraction)} ({self.how})"


NOT_ENFORCED = Enforcement(how="KAI without HAMi-core: accounting only")


def _share(value: float) -> str:
    return f"{round(value, 4):g}"


def kai_limit_mib(gpu_memory_mib: int, fraction: float) -> int:
    """KAI's hamicore limit (MiB) for a share: ``int64(float64(label) * portion)`` with the
    portion as the BindRequest carries it (``%.2f``); Python's float is Go's float64 and
    ``int`` truncates as Go's conversion does."""
    portion = float(f"{min(max(fraction, 0.0), 1.0):.2f}")
    return int(float(gpu_memory_mib) * portion)


def kai_share_of(memory_mib: int, gpu_memory_mib: int) -> float:
    """The share a limit stands for: the hundredth KAI computed it from when there is one
    (40779 MiB of 81559 is 0.5, not 0.499994), else MiB over MiB (a limit set by hand)."""
    if gpu_memory_mib <= 0:
        return 1.0
    portion = round(memory_mib / gpu_memory_mib, 2)
    if kai_limit_mib(gpu_memory_mib, portion) == memory_mib:
        return portion
    return min(1.0, memory_mib / gpu_memory_mib)


# --- reading a pod ----------------------------------------------------------------------------


def _fraction_container(pod: PodInfo) -> Mapping[str, Any]:
    return fraction_container(get_path(pod.raw, "spec") or {}, pod.annotations)


def configmaps_of(pod: PodInfo) -> tuple[str, ...]:
    """The ConfigMaps (in the pod's namespace) whose keys a KAI pod's memory limit comes from."""
    if pod.backend is not GpuSharing.KAI:
        return ()
    env = env_var(_fraction_container(pod), MEMORY_LIMIT)
    ref = get_path(env, "valueFrom", "configMapKeyRef") if env else None
    return (str(ref["name"]),) if ref and ref.get("name") else ()


def enforcement_of(
    pod: PodInfo, configmaps: Mapping[str, Mapping[str, str] | None], gpu_memory_mib: int
) -> Enforcement:
    """What limits the pod's GPU memory; ``configmaps``: the data of :func:`configmaps_of`'s
    ConfigMaps as read (None: could not be read); ``gpu_memory_mib``: its GPU's memory."""
    container = _fraction_container(pod)
    if pod.backend is GpuSharing.HAMI:
        flag = env_var(container, DISABLE_CONTROL)
        if flag is not None and str(flag.get("value", "")).strip().lower() in _TRUE:
            return Enforcement(how=f"HAMi with {DISABLE_CONTROL}=true")
        share = pod.share
        if share is None or not share.memory_mib:
            return Enforcement(how="HAMi pod without an allocation", unknown=True)
        return _limited(share.memory_mib, gpu_memory_mib, f"HAMi {share.memory_mib} MiB")
    if pod.backend is not GpuSharing.KAI:
        return Enforcement(how="no GPU share")
    env = env_var(container, MEMORY_LIMIT)
    if env is None:
        return NOT_ENFORCED
    ref = get_path(env, "valueFrom", "configMapKeyRef")
    if ref:
        name, key = str(ref.get("name", "")), str(ref.get("key", MEMORY_LIMIT))
        data = configmaps.get(name)
        if data is None:
            return Enforcement(how=f"ConfigMap {name} not read", unknown=True)
        text, where = data.get(key, ""), f"KAI hamicore, ConfigMap {name}"
        if not text:  # the env is optional: without the binder's value the container has none
            return Enforcement(how=f"ConfigMap {name} holds no {key}: accounting only")
    else:
        text, where = str(env.get("value", "")), "set in the pod"
    try:
        mib = parse_memory_limit(text)
    except ValueError as exc:
        return Enforcement(how=str(exc), unknown=True)
    if mib is None:
        return Enforcement(how=f"{MEMORY_LIMIT}={text} (unlimited)")
    return _limited(mib, gpu_memory_mib, f"{MEMORY_LIMIT}={text}, {where}")


def _limited(mib: int, gpu_memory_mib: int, how: str) -> Enforcement:
    share = kai_share_of(mib, gpu_memory_mib)
    return Enforcement(mib, share, how, gpu_memory_mib=max(gpu_memory_mib, 0))


def enforcement_map(
    pods: Iterable[PodInfo],
    inventory: Inventory,
    configmaps: Mapping[str, Mapping[str, str] | None],
    default_gpu_memory_mib: int,
) -> dict[str, Enforcement]:
    """Each pod's :class:`Enforcement`, by pod name (its GPU's memory from the inventory)."""
    out: dict[str, Enforcement] = {}
    for pod in pods:
        gpu = inventory.state.gpu(pod.share.gpu_uuid) if pod.share is not None else None
        memory = gpu.memory_bytes // MIB if gpu is not None else default_gpu_memory_mib
        out[pod.name] = enforcement_of(pod, configmaps, memory)
    return out


# --- what that means for a plan ---------------------------------------------------------------


def memory_floor(decision: FractionDecision) -> float | None:
    """The engine's memory floor (peak + headroom) as a share of the device; None: unknown."""
    if decision.memory_need_mib is None:
        return None
    return decision.memory_need_mib * MIB / decision.device_memory_bytes


def _recreate(step: ResizePlan, why: str) -> ResizePlan:
    return step.model_copy(update={"kind": PlanKind.RECREATE_ELSEWHERE, "reason": why})


def _with(plan: WorkloadPlan, steps: list[ResizePlan]) -> WorkloadPlan:
    if tuple(steps) == plan.steps:
        return plan
    kind = max((s.kind for s in steps), key=SEVERITY.__getitem__)
    if len(steps) == 1:
        reason = steps[0].reason
    else:
        reason = "; ".join(f"{s.pod}: {s.kind.value}: {s.reason}" for s in steps)
    return plan.model_copy(update={"kind": kind, "steps": tuple(steps), "reason": reason})


def must_recreate(enforcement: Enforcement, decision: FractionDecision) -> bool:
    """An upsize to the decision's fraction needs a higher limit than the container has (or
    its limit is unknown): only a new container gets it."""
    e = enforcement
    return decision.new_fraction > decision.current_fraction and (
        e.unknown or not e.covers(decision.new_fraction)
    )


def honest_step(
    step: ResizePlan, enforcement: Enforcement, floor: float | None
) -> ResizePlan | str:
    """An in-place step as it really is: kept (its reason saying accounted vs enforced), a
    recreate (an upsize past an enforced limit), or a refusal (a downsize the floor forbids)."""
    if step.kind is not PlanKind.IN_PLACE:
        return step
    before, after, e = step.fraction_before, step.fraction_after, enforcement
    if before is None or after > before:
        if e.unknown or not e.covers(after):
            return _recreate(
                step,
                f"{step.reason}, but {after:g} needs more memory than the container may use "
                f"({e.describe()}), and an in-place change moves only KAI's accounting: "
                "recreate it",
            )
        held = "its enforced limit covers it" if e.enforced else "memory not enforced"
        return step.model_copy(update={"reason": f"{step.reason}; {held} ({e.describe()})"})
    if floor is None:
        return (
            f"not downsized in place to {after:g}: the decision carries no memory need (the "
            "engine's memory floor), so whether the container's usage fits the new accounting "
            "cannot be checked"
        )
    if floor > after + EPS:
        return (
            f"not downsized in place to {after:g}: the container's memory need "
            f"{_share(floor)} (peak + headroom) is above it, and it keeps using that memory "
            "while KAI would pack a neighbour into it"
        )
    kept = (
        f"enforced limit stays {_share(e.fraction)} until the pod restarts"
        if e.fraction is not None
        else e.describe()
    )
    return step.model_copy(
        update={
            "reason": f"{step.reason}; accounting only: its memory need {_share(floor)} (peak "
            f"+ headroom) stays under the new {after:g}; {kept}"
        }
    )


def enforce(
    plan: WorkloadPlan,
    decision: FractionDecision,
    enforcement: Mapping[str, Enforcement],
    may_disrupt: Callable[[], bool],
) -> WorkloadPlan | str:
    """The planner's plan made honest about enforcement (see the module docstring), or why the
    decision must not be carried out. ``may_disrupt``: whether the guardrails would allow a
    disruption now (asked only when converging could recreate a pod)."""
    floor = memory_floor(decision)
    steps: list[ResizePlan] = []
    for step in plan.steps:
        honest = honest_step(step, enforcement.get(step.pod, NOT_ENFORCED), floor)
        if isinstance(honest, str):
            return honest
        steps.append(honest)
    plan = _with(plan, steps)
    if decision.enforcement is not EnforcementMode.RECREATE_WITHIN_BUDGET:
        return plan
    lagging = [s for s in plan.steps if lags(s, enforcement.get(s.pod, NOT_ENFORCED))]
    if not lagging or not may_disrupt():
        return plan
    converged = [
        _recreate(
            s,
            f"{s.reason}; recreated so that the enforced limit follows (enforcement: "
            "recreate_within_budget)",
        )
        if s in lagging
        else s
        for s in plan.steps
    ]
    return _with(plan, converged)


def lags(step: ResizePlan, enforcement: Enforcement) -> bool:
    """After this in-place step the pod's enforced limit differs from its accounting."""
    return step.kind is PlanKind.IN_PLACE and not enforcement.matches(step.fraction_after)


def enforced_after(step: ResizePlan, enforcement: Enforcement, applied: bool) -> float | None:
    """The pod's enforced share once the step is done (``applied``), else as it is now; None:
    not enforced. A recreated pod starts with a limit of its new share, if it had one."""
    if enforcement.fraction is None:
        return None
    if applied and step.kind in (PlanKind.RECREATE_ELSEWHERE, PlanKind.SCALE_UP):
        return step.fraction_after
    return enforcement.fraction


def enforcement_note(step: ResizePlan, enforcement: Enforcement) -> str:
    """For an Event and the result: the accounted share and the enforced one after the step."""
    after, e = step.fraction_after, enforcement
    if e.fraction is None:
        return f"accounted {after:g}; {e.describe()}"
    if step.kind in (PlanKind.RECREATE_ELSEWHERE, PlanKind.SCALE_UP):
        return f"accounted and enforced {after:g} once recreated (now {e.describe()})"
    lag = "" if e.matches(after) else " (lags until the pod restarts)"
    return f"accounted {after:g}; {e.describe()}{lag}"
