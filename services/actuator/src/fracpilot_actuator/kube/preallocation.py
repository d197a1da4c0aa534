"""A downsize of a pod whose container runs an LLM server that preallocates GPU memory (vLLM,
SGLang, TGI: :mod:`fracpilot_libs.llm_servers`). Pure.

Such a server takes its memory pool when it starts and never gives it back, so an in-place
downsize would move only KAI's accounting: the container keeps its pool, and KAI packs a
neighbour into the share it freed. A planned in-place downsize of such a pod is therefore:

- kept in place only when the pool already fits: the server's flag is at most the value the
  rewrite would write for the new share (:func:`fracpilot_libs.llm_servers.flag_value`, the
  same margin), so what it preallocates stays under the new share; the usual memory-floor check
  (:mod:`.enforcement`) then runs as for any pod;
- else a recreate: the admission webhook rewrites the flag on the replacement
  (:mod:`fracpilot_actuator.admission.sizing`), which then allocates within its fraction. It is
  disruptive, so the guardrails (the disruption budget, single replica) decide whether it
  happens now; when they deny it the downsize waits and the result says why (:func:`waits`);
- refused when the flag could not be rewritten on the replacement (a shell script, a
  ``--config`` file, an env value from a reference, ...): the new pod would preallocate as the
  old one does, so neither path shrinks it.

The server is read from the pod spec (its image, command, args and env), never from samples:
what the container allocates is decided by its command line. A KAI fraction alone does not
change what CUDA reports as total, so the flag is a share of the whole card (visible share 1).
Under KAI's hamicore plugin HAMi-core reports the container's memory limit as the total
(:mod:`fracpilot_libs.llm_servers`): the running server's flag is a share of its limit
(:class:`.enforcement.Enforcement`), and the replacement's of the limit it will get for its new
fraction (:func:`fracpilot_libs.llm_servers.kai_hamicore_share`), as the webhook writes it. A
limit written in the pod by hand, or one that cannot be read, leaves the pool's size unknown:
the downsize is refused with the reason. Upsizes are left alone (the pool does not grow, but
the container loses nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fracpilot_actuator.kube.enforcement import NOT_ENFORCED, Enforcement, configmaps_of
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.object_values import get_path
from fracpilot_libs.contracts import PlanKind
from fracpilot_libs.llm_servers import (
    FLAGS,
    FlagReading,
    flag_value,
    format_value,
    kai_hamicore_share,
    read_pod,
    rewrite_pod,
)
from fracpilot_libs.placement.planner import SEVERITY, ResizePlan, WorkloadPlan

KAI_VISIBLE_SHARE = 1.0  # KAI's fractions leave CUDA's total the whole card
_TOLERANCE = 5e-4  # the rewrite leaves a flag within this of its value as it is


def server_of(pod: PodInfo) -> FlagReading:
    """The preallocating server the pod's spec runs (``server`` None: none)."""
    spec = get_path(pod.raw, "spec")
    return read_pod(spec if isinstance(spec, Mapping) else {})


def _setting(reading: FlagReading) -> str:
    """``vllm --gpu-memory-utilization 0.9`` (or "... unset, default 0.92")."""
    assert reading.server is not None
    flag = FLAGS[reading.server]
    if reading.value is not None:
        return f"{reading.server} {flag.flag} {format_value(reading.value)}"
    if flag.default is None:
        return f"{reading.server} {flag.flag} unset (it sizes itself from the card)"
    return f"{reading.server} {flag.flag} unset (default {format_value(flag.default)})"


def pool_fits(
    reading: FlagReading, fraction: float, visible_share: float = KAI_VISIBLE_SHARE
) -> bool:
    """The server's preallocation already fits ``fraction`` of the card, margin included, when
    CUDA reports ``visible_share`` of the card as its total."""
    if not reading.readable or reading.server is None:
        return False
    asked = reading.asked_share(visible_share)
    wanted = flag_value(reading.server, fraction, visible_share) * visible_share
    return asked is not None and asked <= wanted + _TOLERANCE


def visible_shares(
    pod: PodInfo, enforcement: Enforcement, after: float
) -> tuple[float, float] | str:
    """The share of the card CUDA reports as total to the running container and to its
    replacement at ``after``, or why they are unknown (see the module docstring)."""
    if not enforcement.enforced and not enforcement.unknown:
        return KAI_VISIBLE_SHARE, KAI_VISIBLE_SHARE
    if enforcement.unknown or enforcement.fraction is None:
        return (
            "its HAMi-core memory limit, which CUDA reports as the total, is unknown "
            f"({enforcement.how})"
        )
    if not configmaps_of(pod):
        return (
            f"its HAMi-core memory limit is written in the pod ({enforcement.how}): a new pod "
            "would keep it"
        )
    return enforcement.fraction, kai_hamicore_share(after)


def downsize_step(
    step: ResizePlan, pod: PodInfo | None, enforcement: Enforcement = NOT_ENFORCED
) -> ResizePlan | str:
    """One planned step made honest about a preallocating server (see the module docstring):
    as it is, a recreate, or why the downsize cannot be carried out."""
    before, after = step.fraction_before, step.fraction_after
    if step.kind is not PlanKind.IN_PLACE or before is None or after >= before or pod is None:
        return step
    reading = server_of(pod)
    if reading.server is None:
        return step
    where = f"container {reading.container_name!r}"
    shares = visible_shares(pod, enforcement, after)
    if isinstance(shares, str):
        return (
            f"not downsized to {after:g}: {reading.server} in {where} preallocates a share of "
            f"what CUDA reports as total, and {shares}"
        )
    now_visible, new_visible = shares
    if pool_fits(reading, after, now_visible):
        return step.model_copy(
            update={
                "reason": f"{step.reason}; its preallocated pool already fits: {_setting(reading)}"
                f" in {where} stays within {after:g} of the GPU"
            }
        )
    spec = get_path(pod.raw, "spec")
    rewrite = rewrite_pod(
        spec if isinstance(spec, Mapping) else {}, after, visible_share=new_visible
    )
    if rewrite.problem:
        return (
            f"not downsized to {after:g}: {reading.server} in {where} preallocates its memory "
            "and its pool does not shrink in place, and its memory flag cannot be rewritten on "
            f"a new pod ({rewrite.problem}): a recreated pod would preallocate as this one does"
        )
    flag = FLAGS[reading.server].flag
    return step.model_copy(
        update={
            "kind": PlanKind.RECREATE_ELSEWHERE,
            "reason": f"{step.reason}, but {_setting(reading)} in {where} preallocates more "
            f"than {after:g} of the GPU and its pool does not shrink in place: recreate it, "
            f"the new pod started with {flag}={rewrite.value}",
        }
    )


@dataclass(frozen=True)
class Preallocation:
    """The plan with its preallocating servers' downsizes made recreates (where needed)."""

    plan: WorkloadPlan
    recreated: tuple[str, ...] = ()  # the pods whose in-place downsize became a recreate


def preallocation_rule(
    plan: WorkloadPlan,
    pods: Mapping[str, PodInfo],
    enforcement: Mapping[str, Enforcement] | None = None,
) -> Preallocation | str:
    """The planner's plan with every in-place downsize of a preallocating server kept, made a
    recreate, or refused (the refusal's text), by pod name in ``pods`` (``enforcement``: each
    pod's memory limit, :func:`.enforcement.enforcement_map`; absent: none)."""
    steps: list[ResizePlan] = []
    recreated: list[str] = []
    limits = enforcement or {}
    for step in plan.steps:
        honest = downsize_step(step, pods.get(step.pod), limits.get(step.pod, NOT_ENFORCED))
        if isinstance(honest, str):
            return honest
        if honest.kind is not step.kind:
            recreated.append(step.pod)
        steps.append(honest)
    if tuple(steps) == plan.steps:
        return Preallocation(plan)
    kind = max((s.kind for s in steps), key=SEVERITY.__getitem__)
    if len(steps) == 1:
        reason = steps[0].reason
    else:
        reason = "; ".join(f"{s.pod}: {s.kind.value}: {s.reason}" for s in steps)
    changed = plan.model_copy(update={"kind": kind, "steps": tuple(steps), "reason": reason})
    return Preallocation(changed, tuple(recreated))


def waits(recreated: tuple[str, ...]) -> str:
    """Said when the guardrails deny the recreate a preallocating server's downsize needs."""
    pods = ", ".join(recreated)
    return (
        f"the downsize waits: {pods} run(s) an LLM server whose preallocated pool does not "
        "shrink in place, so it is downsized only by a recreate, which the guardrails deny now"
    )
