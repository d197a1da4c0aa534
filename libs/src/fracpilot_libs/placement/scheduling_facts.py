"""What kube-scheduler's filters look at, read from raw Node and Pod objects (camelCase JSON).

:class:`NodeFacts`, :class:`PodFacts` and :class:`ClusterFacts` carry labels, taints,
tolerations, node selector and affinity terms, pod (anti-)affinity, topology spread constraints
and resource requests (init containers and overhead included, as
``k8s.io/component-helpers/resource/helpers.go`` aggregates them); the rules that judge them are
in :mod:`fracpilot_libs.placement.predicates`. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fracpilot_libs.placement.quantities import Resources, quantity, resources_of

# The node resources kube-scheduler counts (any other is the planner's business).
COUNTED = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})


def label_text(labels: Mapping[str, str], key: str) -> str:
    """What the node has of label ``key``, for the reasons the predicates give."""
    return f"node has {key}={labels[key]}" if key in labels else f"node has no {key}"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # "" means Equal
    value: str = ""
    effect: str = ""  # "": every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"  # Gt/Lt: alpha and off by default: no match


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` (or ``matchFields``) entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has, value = self.key in labels, labels.get(self.key, "")
        match self.operator:
            case "In":
                return has and value in self.values
            case "NotIn":
                return not has or value not in self.values
            case "Exists":
                return has
            case "DoesNotExist":
                return not has
            case "Gt" | "Lt":
                if not has or len(self.values) != 1:
                    return False
                try:
                    mine, bound = int(value), int(self.values[0])
                except ValueError:
                    return False
                return mine > bound if self.operator == "Gt" else mine < bound
        return False

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        return f"{self.key} {self.operator} [{','.join(self.values)}]"


@dataclass(frozen=True)
class NodeSelectorTerm:
    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()  # only metadata.name, In/NotIn with one value

    def failing(self, node: NodeFacts) -> str | None:
        """The first requirement the node fails; None when the term matches."""
        if not self.expressions and not self.fields:
            return "empty term"
        for req in self.expressions:
            if not req.matches(node.labels):
                return f"{req} ({label_text(node.labels, req.key)})"
        for req in self.fields:
            ok = (
                req.key == "metadata.name"
                and req.operator in ("In", "NotIn")
                and len(req.values) == 1
                and (node.name == req.values[0]) == (req.operator == "In")
            )
            if not ok:
                return f"field {req}"
        return None


@dataclass(frozen=True)
class LabelSelector:
    """A ``metav1.LabelSelector``; ``{}`` selects everything (a missing one: nothing, None)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.expressions
        )

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.expressions

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in self.match_labels] + [str(r) for r in self.expressions]
        return ",".join(parts) or "everything"


def selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    return selector is not None and selector.matches(labels)


@dataclass(frozen=True)
class PodAffinityTerm:
    topology_key: str
    selector: LabelSelector | None
    namespaces: frozenset[str]  # the owner's namespace when neither list nor selector is set
    namespace_selector: LabelSelector | None = None

    def matches(self, pod: PodFacts, namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
        in_namespace = pod.namespace in self.namespaces or selects(
            self.namespace_selector, namespace_labels.get(pod.namespace, {})
        )
        return in_namespace and selects(self.selector, pod.labels)

    def __str__(self) -> str:
        return f"{self.selector if self.selector is not None else 'nothing'} by {self.topology_key}"


@dataclass(frozen=True)
class SpreadConstraint:
    """A ``topologySpreadConstraints`` entry with ``whenUnsatisfiable: DoNotSchedule``."""

    max_skew: int
    topology_key: str
    selector: LabelSelector | None
    min_domains: int = 1
    honor_node_affinity: bool = True  # nodeAffinityPolicy (default Honor)
    honor_taints: bool = False  # nodeTaintsPolicy (default Ignore)


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Resources = field(default_factory=Resources)
    pods: int = 110  # allocatable pods
    unschedulable: bool = False
    # What the node reports in status.allocatable: kube-scheduler counts a missing one as 0;
    # here it is not checked (real nodes report all; simulated and test nodes often do not).
    reported: frozenset[str] = COUNTED


@dataclass(frozen=True)
class PodFacts:
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    node: str = ""  # where it runs (spec.nodeName); "" for a pod not bound yet
    terminating: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_terms: tuple[NodeSelectorTerm, ...] | None = None  # None: no required node affinity
    tolerations: tuple[Toleration, ...] = ()
    requests: Resources = field(default_factory=Resources)
    affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ClusterFacts:
    """Every node and the pods on each (terminal pods left out), and namespace labels."""

    nodes: Mapping[str, NodeFacts]
    pods_on_nodes: Mapping[str, tuple[PodFacts, ...]]
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def without(self, pod_key: str) -> ClusterFacts:
        """The cluster once the pod is gone (its replacement is the pod being placed)."""
        return self.moved({pod_key: ""})

    def moved(self, to: Mapping[str, str]) -> ClusterFacts:
        """The cluster with pods (by ``namespace/name``) on other nodes ("" = gone)."""
        if not to:
            return self
        pods = [p for ps in self.pods_on_nodes.values() for p in ps]
        pods = [replace(p, node=to[p.key]) if p.key in to else p for p in pods]
        return replace(self, pods_on_nodes=pods_by_node(pods))


def pods_by_node(pods: Iterable[PodFacts]) -> dict[str, tuple[PodFacts, ...]]:
    """Bound pods by node name; pods on no node are left out."""
    grouped: dict[str, list[PodFacts]] = {}
    for pod in pods:
        if pod.node:
            grouped.setdefault(pod.node, []).append(pod)
    return {node: tuple(ps) for node, ps in grouped.items()}


# --- parsing raw API objects (camelCase JSON) --------------------------------------------------


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


def _requirement(raw: Mapping[str, Any]) -> Requirement:
    return Requirement(
        key=str(raw.get("key", "")),
        operator=str(raw.get("operator", "")),
        values=tuple(str(v) for v in raw.get("values") or ()),
    )


def _label_selector(raw: Mapping[str, Any] | None) -> LabelSelector | None:
    if raw is None:
        return None
    return LabelSelector(
        match_labels=tuple(sorted(_strings(raw.get("matchLabels")).items())),
        expressions=tuple(_requirement(r) for r in raw.get("matchExpressions") or ()),
    )


def node_facts(raw: Mapping[str, Any]) -> NodeFacts:
    """A Node as the API returns it; a quantity that does not parse raises ValueError."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    allocatable = (raw.get("status") or {}).get("allocatable") or {}
    return NodeFacts(
        name=str(meta.get("name", "")),
        labels=_strings(meta.get("labels")),
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in spec.get("taints") or ()
        ),
        allocatable=resources_of(allocatable),
        pods=int(quantity(allocatable["pods"])) if "pods" in allocatable else 0,
        unschedulable=bool(spec.get("unschedulable")),
        reported=COUNTED & allocatable.keys(),
    )


def _container_requests(container: Mapping[str, Any]) -> Resources:
    """Requests, defaulted from limits as the API server does for a request left out."""
    resources = container.get("resources") or {}
    return resources_of({**(resources.get("limits") or {}), **(resources.get("requests") or {})})


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """What kube-scheduler reserves for the pod (``AggregateContainerRequests`` + overhead)."""
    total = Resources()
    for container in spec.get("containers") or ():
        total += _container_requests(container)
    sidecars, init_peak = Resources(), Resources()
    for container in spec.get("initContainers") or ():
        request = _container_requests(container)
        if container.get("restartPolicy") == "Always":  # a sidecar runs beside the containers
            total += request
            sidecars += request
            init_peak = init_peak.max(sidecars)
        else:  # runs alone, beside the sidecars started before it
            init_peak = init_peak.max(request + sidecars)
    return total.max(init_peak) + resources_of(spec.get("overhead"))


def _affinity_terms(raw_terms: Any, namespace: str) -> tuple[PodAffinityTerm, ...]:
    terms = []
    for raw in raw_terms or ():
        namespaces = frozenset(str(n) for n in raw.get("namespaces") or ())
        ns_selector = _label_selector(raw.get("namespaceSelector"))
        if not namespaces and ns_selector is None:
            namespaces = frozenset({namespace})
        terms.append(
            PodAffinityTerm(
                topology_key=str(raw.get("topologyKey", "")),
                selector=_label_selector(raw.get("labelSelector")),
                namespaces=namespaces,
                namespace_selector=ns_selector,
            )
        )
    return tuple(terms)


def pod_facts(raw: Mapping[str, Any]) -> PodFacts:
    """A Pod as the API returns it; a quantity that does not parse raises ValueError."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    namespace = str(meta.get("namespace", ""))
    affinity = spec.get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    node_terms = None
    if required is not None:
        node_terms = tuple(
            NodeSelectorTerm(
                expressions=tuple(_requirement(r) for r in term.get("matchExpressions") or ()),
                fields=tuple(_requirement(r) for r in term.get("matchFields") or ()),
            )
            for term in required.get("nodeSelectorTerms") or ()
        )
    pod_affinity = (affinity.get("podAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    pod_anti = (affinity.get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return PodFacts(
        namespace=namespace,
        name=str(meta.get("name", "")),
        labels=_strings(meta.get("labels")),
        node=str(spec.get("nodeName") or ""),
        terminating=meta.get("deletionTimestamp") is not None,
        node_selector=_strings(spec.get("nodeSelector")),
        node_terms=node_terms,
        tolerations=tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in spec.get("tolerations") or ()
        ),
        requests=pod_requests(spec),
        affinity=_affinity_terms(pod_affinity, namespace),
        anti_affinity=_affinity_terms(pod_anti, namespace),
        spread=tuple(
            SpreadConstraint(
                max_skew=int(c.get("maxSkew", 1)),
                topology_key=str(c.get("topologyKey", "")),
                selector=_label_selector(c.get("labelSelector")),
                min_domains=int(c.get("minDomains") or 1),
                honor_node_affinity=c.get("nodeAffinityPolicy", "Honor") == "Honor",
                honor_taints=c.get("nodeTaintsPolicy", "Ignore") == "Honor",
            )
            for c in spec.get("topologySpreadConstraints") or ()
            if c.get("whenUnsatisfiable") == "DoNotSchedule"
        ),
    )


def is_terminal(raw: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: the scheduler no longer counts the pod."""
    return (raw.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def cluster_facts(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> ClusterFacts:
    """Facts from raw Node and Pod objects (terminal pods left out)."""
    by_name = {n.name: n for n in map(node_facts, nodes)}
    live = (pod_facts(p) for p in pods if not is_terminal(p))
    return ClusterFacts(by_name, pods_by_node(live), dict(namespace_labels or {}))
