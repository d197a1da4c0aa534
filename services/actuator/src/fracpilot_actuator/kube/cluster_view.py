"""What the judge (:mod:`.judge`) is given besides the decision: the cluster as one decision
sees it (:class:`ClusterView`, read by :mod:`.reader`) and what the guardrails need
(:class:`Guards`). Pure data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fracpilot_actuator.guardrails import GuardrailSettings, GuardState
from fracpilot_actuator.kube.enforcement import Enforcement
from fracpilot_actuator.kube.gangs import PodGroup
from fracpilot_actuator.kube.inventory import Inventory, PodInfo
from fracpilot_actuator.kube.queues import Queue
from fracpilot_actuator.settings import OptInSettings
from fracpilot_actuator.stores.forecasts import KnownForecast
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.kai import KaiSettings
from fracpilot_libs.owners import Controller, OwnerKey


@dataclass(frozen=True)
class CoTenant:
    """What the backend knows of a pod sharing the deciding pod's GPU (its namespace's)."""

    workload: WorkloadRef
    known: KnownForecast | None  # its workload's last forecast; None: none (or too old)
    owner_opted_out: bool = False  # its workload object opts out (or could not be read)


@dataclass(frozen=True)
class ClusterView:
    """The cluster as one decision sees it."""

    inventory: Inventory
    pods: tuple[PodInfo, ...]  # the workload's pods, terminating ones included
    owner: Mapping[str, Any] | None = None  # the workload object, when it was read
    namespace_labels: Mapping[str, Any] = field(default_factory=dict)  # the workload's namespace
    queues: Mapping[str, Queue] | None = None  # KAI's Queues by name; None: not read
    pod_groups: Mapping[str, PodGroup] | None = None  # KAI's PodGroups by ns/name; None: not read
    enforcement: Mapping[str, Enforcement] = field(default_factory=dict)  # by pod name
    owners: Mapping[OwnerKey, Controller] = field(default_factory=dict)  # the namespace's
    co_tenants: Mapping[str, CoTenant] = field(default_factory=dict)  # by pod ns/name

    @property
    def live(self) -> tuple[PodInfo, ...]:
        return tuple(p for p in self.pods if not p.terminating)


@dataclass(frozen=True)
class Guards:
    """What the guardrails need besides the decision: their memory and their limits."""

    state: GuardState
    settings: GuardrailSettings
    patches_templates: bool = False
    """targets_via=template: every change patches the pod template (a rollout: disruptive)."""
    opt_in: OptInSettings = field(default_factory=OptInSettings)
    """The opt-in rule's settings (the default mode, the excluded namespaces)."""
    kai: KaiSettings = field(default_factory=KaiSettings)
    """KAI's set-up and how far an in-place upsize may take a KAI queue (:mod:`.queues`)."""
