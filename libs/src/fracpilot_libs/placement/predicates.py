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

from collections.abc import Callable, Iterable, Sequence

from fracpilot_libs.placement.planner import ClusterState, NodeOkFor, Placement
from fracpilot_libs.placement.quantities import Resources
from fracpilot_libs.placement.scheduling_facts import (
    ClusterFacts,
    NodeFacts,
    PodFacts,
    Taint,
    label_text,
    selects,
)

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
HOSTNAME = "kubernetes.io/hostname"

NodeRule = Callable[[str], str | None]
"""Why the pod may not go to node ``name``; None when it may (the planner's ``NodeOk``)."""


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
            return f"nodeSelector {key}={value} not matched ({label_text(node.labels, key)})"
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
        self_match = 1 if selects(c.selector, pod.labels) else 0
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
