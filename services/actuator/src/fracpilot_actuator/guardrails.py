"""Guardrails: whether the actuator may act on a decision now. Pure; time is passed in.

Each guard is a function returning a :class:`Verdict` (allowed, or denied with the reason);
:func:`check` runs them in order and the first denial wins (VPA's admission chain):

1. opt-out: ``fracpilot.io/opt-out: "true"`` on a pod of the workload or on its owner;
2. stale: the decision was made before the workload's last change (a pod created, or a
   resize applied, after it): it was computed on a picture that is gone;
3. in flight: another action on the same workload has not finished (a scale-up waiting for
   capacity, an eviction under way, a pod still terminating);
and, for disruptive plans only (a pod is evicted):
4. single replica: evicting a workload's only pod takes it down; only when allowed;
5. rate: at most ``max_disruptions`` per ``window_s`` cluster-wide and
   ``max_disruptions_per_namespace`` per namespace.

:class:`GuardState` is the small memory the rate and in-flight guards need: when recent
disruptive actions happened and where, and which workloads are in flight.
Dry-run is not a guard: the actuator plans and checks as usual, then changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta


@dataclass(frozen=True)
class GuardrailSettings:
    max_disruptions: int = 5
    """Disruptive actions (a decision that evicts pods) per window, cluster-wide; 0: none."""
    max_disruptions_per_namespace: int = 2
    """The same, per namespace."""
    window_s: float = 600.0
    """The sliding window of the two limits above, seconds."""
    allow_single_replica: bool = False
    """Whether a workload with one pod may be recreated (it is down until the new pod runs)."""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    guard: str
    reason: str

    @staticmethod
    def allow(guard: str, reason: str = "") -> Verdict:
        return Verdict(True, guard, reason)

    @staticmethod
    def deny(guard: str, reason: str) -> Verdict:
        return Verdict(False, guard, reason)


@dataclass(frozen=True)
class Disruption:
    """One disruptive action (pods evicted or a template rolled out), remembered for the rate
    limits."""

    workload: str  # WorkloadRef.key
    namespace: str
    at: datetime


@dataclass(frozen=True)
class GuardState:
    recent: tuple[Disruption, ...] = ()
    in_flight: frozenset[str] = field(default_factory=frozenset)

    def record(self, action: Disruption, window_s: float) -> GuardState:
        """Remember a disruptive action; forget those older than the window."""
        return replace(self, recent=(*self.pruned(action.at, window_s).recent, action))

    def pruned(self, now: datetime, window_s: float) -> GuardState:
        since = now - timedelta(seconds=window_s)
        return replace(self, recent=tuple(a for a in self.recent if a.at > since))

    def begin(self, workload: str) -> GuardState:
        return replace(self, in_flight=self.in_flight | {workload})

    def end(self, workload: str) -> GuardState:
        return replace(self, in_flight=self.in_flight - {workload})


@dataclass(frozen=True)
class Subject:
    """What the guards look at for one decision."""

    workload: str  # WorkloadRef.key
    namespace: str
    decided_at: datetime
    last_change: datetime | None
    replicas: int
    opted_out_by: str = ""  # what carries the opt-out, e.g. "pod inference/chat-0"; "" = none
    busy: str = ""  # why the workload is in flight as seen in the cluster; "" = it is not


def opt_out(subject: Subject) -> Verdict:
    if subject.opted_out_by:
        return Verdict.deny(
            "opt_out", f"opted out by fracpilot.io/opt-out on {subject.opted_out_by}"
        )
    return Verdict.allow("opt_out")


def stale(subject: Subject) -> Verdict:
    changed = subject.last_change
    if changed is not None and subject.decided_at < changed:
        return Verdict.deny(
            "stale",
            f"decision made at {subject.decided_at.isoformat()} is older than the workload's "
            f"last change at {changed.isoformat()}",
        )
    return Verdict.allow("stale")


def in_flight(subject: Subject, state: GuardState) -> Verdict:
    if subject.workload in state.in_flight:
        return Verdict.deny("in_flight", "another action on this workload is in flight")
    if subject.busy:
        return Verdict.deny("in_flight", f"the workload is changing: {subject.busy}")
    return Verdict.allow("in_flight")


def single_replica(subject: Subject, settings: GuardrailSettings) -> Verdict:
    if subject.replicas <= 1 and not settings.allow_single_replica:
        return Verdict.deny(
            "single_replica",
            "the workload has a single replica; recreating it would take it down "
            "(allow_single_replica is off)",
        )
    return Verdict.allow("single_replica")


def rate(
    subject: Subject, state: GuardState, settings: GuardrailSettings, now: datetime
) -> Verdict:
    recent = state.pruned(now, settings.window_s).recent
    window = f"{settings.window_s:g} s"
    if len(recent) >= settings.max_disruptions:
        return Verdict.deny(
            "rate",
            f"{len(recent)} disruptive actions in the last {window} "
            f"(cluster-wide limit {settings.max_disruptions})",
        )
    in_namespace = sum(1 for a in recent if a.namespace == subject.namespace)
    if in_namespace >= settings.max_disruptions_per_namespace:
        return Verdict.deny(
            "rate",
            f"{in_namespace} disruptive actions in namespace {subject.namespace} in the last "
            f"{window} (limit {settings.max_disruptions_per_namespace})",
        )
    return Verdict.allow("rate")


def check(
    subject: Subject,
    *,
    disruptive: bool,
    state: GuardState,
    settings: GuardrailSettings,
    now: datetime,
) -> Verdict:
    """The first denial, or an allowance that lists what was checked."""
    verdicts = [opt_out(subject), stale(subject), in_flight(subject, state)]
    if disruptive:
        verdicts += [single_replica(subject, settings), rate(subject, state, settings, now)]
    for verdict in verdicts:
        if not verdict.allowed:
            return verdict
    return Verdict.allow("all", "checked " + ", ".join(v.guard for v in verdicts))
