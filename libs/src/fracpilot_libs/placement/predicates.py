"""May this pod run on that node? kube-scheduler's filter plugins, as pure functions.

Written from kube-scheduler's own code (kubernetes v1.35.4; read, not copied):

- taints and tolerations: ``pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go``
  with ``k8s.io/component-helpers/scheduling/corev1/helpers.go`` (``FindMatchingUntoleratedTaint``)
  and ``k8s.io/api/core/v1/toleration.go`` (``ToleratesTaint``): only ``NoSchedule`` and
  ``NoExecute`` taints block; an empty toleration effect or key (with ``Exists``) matches any;
  the alpha ``Gt``/``Lt`` toleration operators are off by default, so they tolerate nothing;
- node selector and required node affinity:
  ``pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go`` with
  ``k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity.go``: ``nodeSelector``
  ANDed with the terms, terms ORed, expressions ANDed, an empty term matches nothing,
  ``Gt``/``Lt`` compare integers, ``matchFields`` knows ``metadata.name`` with one value;
- resources: ``pkg/scheduler/framework/plugins/noderesources/fit.go`` (``fitsRequest``) and
  ``k8s.io/component-helpers/resource/helpers.go`` (``AggregateContainerRequests``): the pod
  asks the larger of its containers' sum (plus restartable init containers, "sidecars") and
  each init container, plus the overhead; the node must hold it beside its pods' requests, and
  one more pod than it has must stay within ``pods``;
- ``pkg/scheduler/framework/plugins/nodeunschedulable/node_unschedulable.go``: a cordoned node;
- inter-pod affinity: ``pkg/scheduler/framework/plugins/interpodaffinity/filtering.go``: each
  required affinity term needs a matching pod in the node's topology domain (unless no pod
  matches any term anywhere and the pod matches all its own terms: the first of a group);
  anti-affinity terms refuse a domain holding a matching pod, both the incoming pod's terms and
  the terms of pods already there (symmetry);
- topology spread: ``pkg/scheduler/framework/plugins/podtopologyspread/filtering.go`` and
  ``common.go``: ``DoNotSchedule`` constraints only; domains from nodes that have every
  constraint's key and (``nodeAffinityPolicy: Honor``, the default) match the pod's node
  affinity; matching pods of the pod's namespace, not terminating; skew =
  matching in the node's domain + 1 if the pod matches - the smallest domain's count (0 when
  fewer domains than ``minDomains``).

Not modelled: host ports, volumes, DRA, extended resources (GPUs are the planner's business),
``matchLabelKeys``, preferred (scoring) rules. KAI-Scheduler v0.12 runs the node affinity,
taint, inter-pod affinity and resource checks but no topology spread
(``pkg/scheduler/k8s_internal/predicates/predicates.go`` in NVIDIA/KAI-scheduler), hence
``spread=False`` for its pods.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from fracpilot_libs.placement.planner import ClusterState, NodeOkFor, Placement

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
COUNTED = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
HOSTNAME = "kubernetes.io/hostname"

NodeRule = Callable[[str], str | None]
"""Why the pod may not go to node ``name``; None when it may (the planner's ``NodeOk``)."""

# --- quantities ------------------------------------------------------------------------------

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(e[+-]?\d+|E[+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_SUFFIX = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
}


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (``"500m"``, ``"2Gi"``, ``"1e3"``, ``4``); ValueError otherwise."""
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, suffix = match.groups()
    try:
        if suffix and suffix[0] in "eE" and len(suffix) > 1:
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX.get(suffix or "", Decimal(1))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a number") from None


# --- the facts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """What kube-scheduler counts: CPU in millicores, memory and ephemeral storage in bytes
    (rounded up, as ``Quantity.MilliValue``/``Value`` do)."""

    cpu_milli: int = 0
    memory: int = 0
    ephemeral_storage: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.memory + other.memory,
            self.ephemeral_storage + other.ephemeral_storage,
        )

    def max(self, other: Resources) -> Resources:
        return Resources(
            max(self.cpu_milli, other.cpu_milli),
            max(self.memory, other.memory),
            max(self.ephemeral_storage, other.ephemeral_storage),
        )

    @property
    def zero(self) -> bool:
        return not (self.cpu_milli or self.memory or self.ephemeral_storage)


def resources_of(values: Mapping[str, Any] | None) -> Resources:
    values = values or {}

    def amount(name: str, scale: int) -> int:
        return math.ceil(quantity(values[name]) * scale) if name in values else 0

    return Resources(amount("cpu", 1000), amount("memory", 1), amount("ephemeral-storage", 1))


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
                return f"{req} ({_has(node.labels, req.key)})"
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


def _selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    return selector is not None and selector.matches(labels)


@dataclass(frozen=True)
class PodAffinityTerm:
    topology_key: str
    selector: LabelSelector | None
    namespaces: frozenset[str]  # the owner's namespace when neither list nor selector is set
    namespace_selector: LabelSelector | None = None

    def matches(self, pod: PodFacts, namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
        in_namespace = pod.namespace in self.namespaces or _selects(
            self.namespace_selector, namespace_labels.get(pod.namespace, {})
        )
        return in_namespace and _selects(self.selector, pod.labels)

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
    allocatable: Resources = Resources()
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
    requests: Resources = Resources()
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


# --- the predicates --------------------------------------------------------------------------


def _has(labels: Mapping[str, str], key: str) -> str:
    return f"node has {key}={labels[key]}" if key in labels else f"node has no {key}"


def untolerated_taint(pod: PodFacts, node: NodeFacts) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration of the pod tolerates."""
    for taint in node.taints:
        if taint.effect in BLOCKING_EFFECTS and not any(
            t.tolerates(taint) for t in pod.tolerations
        ):
            return taint
    return None


def node_affinity_failure(pod: PodFacts, node: NodeFacts) -> str | None:
    """Why the node fails the pod's nodeSelector or required node affinity; None if it passes."""
    for key, value in sorted(pod.node_selector.items()):
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} not matched ({_has(node.labels, key)})"
    if pod.node_terms is None:
        return None
    failures = []
    for term in pod.node_terms:
        if (why := term.failing(node)) is None:
            return None
        failures.append(why)
    return "required node affinity: no term matches (" + "; ".join(failures or ["no terms"]) + ")"


def matches_node_affinity(pod: PodFacts, node: NodeFacts) -> bool:
    return node_affinity_failure(pod, node) is None


def resource_failure(pod: PodFacts, node: NodeFacts, on_node: Sequence[PodFacts]) -> str | None:
    """NodeResourcesFit: the pod's request beside the requests of the node's pods."""
    if "pods" in node.reported and len(on_node) + 1 > node.pods:
        return f"too many pods ({len(on_node)} of {node.pods} allowed)"
    want = pod.requests
    if want.zero:
        return None
    used = Resources()
    for other in on_node:
        used += other.requests
    have = node.allocatable
    checks = (
        ("cpu", want.cpu_milli, used.cpu_milli, have.cpu_milli, "m"),
        ("memory", want.memory, used.memory, have.memory, ""),
        (
            "ephemeral-storage",
            want.ephemeral_storage,
            used.ephemeral_storage,
            have.ephemeral_storage,
            "",
        ),
    )
    for name, asked, in_use, total, unit in checks:
        if asked > 0 and name in node.reported and asked > total - in_use:
            return (
                f"insufficient {name} (asks {asked}{unit}, {in_use}{unit} of "
                f"{total}{unit} requested already)"
            )
    return None


def _domain_pods(
    cluster: ClusterFacts, key: str, value: str
) -> Iterable[tuple[NodeFacts, PodFacts]]:
    for name, pods in cluster.pods_on_nodes.items():
        node = cluster.nodes.get(name)
        if node is not None and node.labels.get(key) == value:
            for pod in pods:
                yield node, pod


def pod_affinity_failure(pod: PodFacts, node: NodeFacts, cluster: ClusterFacts) -> str | None:
    """InterPodAffinity: the pod's required (anti-)affinity and existing pods' anti-affinity."""
    ns_labels = cluster.namespace_labels
    everyone = [
        (cluster.nodes[n], p)
        for n, ps in cluster.pods_on_nodes.items()
        if n in cluster.nodes
        for p in ps
    ]
    # existing pods' anti-affinity against this pod (the symmetric rule)
    for where, other in everyone:
        for term in other.anti_affinity:
            key = term.topology_key
            same = key in where.labels and node.labels.get(key) == where.labels[key]
            if same and term.matches(pod, ns_labels):
                return (
                    f"pod {other.key} on {where.name} has anti-affinity to it "
                    f"({term}: same {key}={where.labels[key]})"
                )
    for term in pod.anti_affinity:
        key = term.topology_key
        if key not in node.labels:
            continue
        for _, other in _domain_pods(cluster, key, node.labels[key]):
            if term.matches(other, ns_labels):
                return (
                    f"pod anti-affinity ({term}): pod {other.key} is in the same "
                    f"{key}={node.labels[key]}"
                )
    if not pod.affinity:
        return None
    missing = None
    for term in pod.affinity:
        key = term.topology_key
        if key not in node.labels:
            return f"pod affinity ({term}): node has no label {key}"
        if missing is None and not any(
            term.matches(other, ns_labels)
            for _, other in _domain_pods(cluster, key, node.labels[key])
        ):
            missing = term
    if missing is None:
        return None
    # The first pod of a group: no pod anywhere matches any term, and the pod matches its own.
    anyone = any(
        t.topology_key in where.labels and t.matches(other, ns_labels)
        for where, other in everyone
        for t in pod.affinity
    )
    if not anyone and all(t.matches(pod, ns_labels) for t in pod.affinity):
        return None
    key = missing.topology_key
    return f"pod affinity ({missing}): no matching pod in {key}={node.labels[key]}"


def spread_failure(pod: PodFacts, node: NodeFacts, cluster: ClusterFacts) -> str | None:
    """PodTopologySpread, DoNotSchedule constraints."""
    if not pod.spread:
        return None
    keys = {c.topology_key for c in pod.spread}
    counts: list[dict[str, int]] = [{} for _ in pod.spread]
    for other_node in cluster.nodes.values():
        if not keys <= other_node.labels.keys():
            continue
        on_node = cluster.pods_on_nodes.get(other_node.name, ())
        for i, c in enumerate(pod.spread):
            if c.honor_node_affinity and not matches_node_affinity(pod, other_node):
                continue
            if c.honor_taints and untolerated_taint(pod, other_node) is not None:
                continue
            matching = 0
            if c.selector is not None and not c.selector.empty:
                matching = sum(
                    1
                    for p in on_node
                    if not p.terminating
                    and p.namespace == pod.namespace
                    and c.selector.matches(p.labels)
                )
            value = other_node.labels[c.topology_key]
            counts[i][value] = counts[i].get(value, 0) + matching
    for i, c in enumerate(pod.spread):
        key = c.topology_key
        if key not in node.labels:
            return f"topology spread: node has no label {key}"
        domains = counts[i]
        smallest = min(domains.values()) if domains else 0
        if len(domains) < c.min_domains:
            smallest = 0
        self_match = 1 if _selects(c.selector, pod.labels) else 0
        skew = domains.get(node.labels[key], 0) + self_match - smallest
        if skew > c.max_skew:
            return (
                f"topology spread on {key}: skew {skew} > maxSkew {c.max_skew} "
                f"({key}={node.labels[key]} has {domains.get(node.labels[key], 0)} matching, "
                f"the fewest {smallest})"
            )
    return None


def node_fits(
    pod: PodFacts, node: NodeFacts, cluster: ClusterFacts, *, spread: bool = True
) -> str | None:
    """None when the pod may go to the node, else the first failing predicate, readable
    ("node gpu-2: taint gpu=reserved:NoSchedule not tolerated"). kube-scheduler's filter
    order: unschedulable, taints, node affinity, resources, topology spread, pod affinity.
    ``cluster`` holds the pods already placed (leave the pod itself out: :meth:`without`);
    ``spread=False``: a scheduler without topology spread (KAI)."""
    why = _first_failure(pod, node, cluster, spread)
    return None if why is None else f"node {node.name}: {why}"


def _first_failure(
    pod: PodFacts, node: NodeFacts, cluster: ClusterFacts, spread: bool
) -> str | None:
    if node.unschedulable and not any(
        t.tolerates(Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")) for t in pod.tolerations
    ):
        return "cordoned (spec.unschedulable)"
    if (taint := untolerated_taint(pod, node)) is not None:
        return f"taint {taint} not tolerated"
    if (why := node_affinity_failure(pod, node)) is not None:
        return why
    on_node = cluster.pods_on_nodes.get(node.name, ())
    if (why := resource_failure(pod, node, on_node)) is not None:
        return why
    if spread and (why := spread_failure(pod, node, cluster)) is not None:
        return why
    return pod_affinity_failure(pod, node, cluster)


def node_rule(pod: PodFacts, cluster: ClusterFacts, *, spread: bool = True) -> NodeRule:
    """The planner's rule for where the pod's replacement may go (the pod itself left out);
    a node without facts is refused."""
    without = cluster.without(pod.key)

    def rule(name: str) -> str | None:
        node = without.nodes.get(name)
        if node is None:
            return f"node {name}: not known"
        return node_fits(pod, node, without, spread=spread)

    return rule


def node_ok_for(cluster: ClusterFacts, *, spread: bool = True) -> NodeOkFor:
    """The planner's ``node_ok_for`` from the cluster's facts: each pod's replacement is
    checked with the pod itself left out and the pods earlier steps moved on their new nodes.
    A pod without facts (not bound to a node) may go anywhere, as before predicates."""
    by_key = {p.key: p for pods in cluster.pods_on_nodes.values() for p in pods}

    def for_pod(placement: Placement, state: ClusterState) -> NodeRule | None:
        pod = by_key.get(placement.pod_key)
        if pod is None:
            return None
        moved: dict[str, str] = {}
        for other in state.placements:
            gpu, facts = state.gpu(other.gpu_uuid), by_key.get(other.pod_key)
            if gpu is not None and facts is not None and facts.node != gpu.node:
                moved[other.pod_key] = gpu.node
        return node_rule(pod, cluster.moved(moved), spread=spread)

    return for_pod
