"""The admission webhook's pure core (fracpilot_actuator.admission): review in, JSONPatch out.

Each patch is applied with the small RFC 6902 applier below (strict: a ``replace`` or ``remove``
of a missing member, or an op under a missing parent, fails), so a path that is not escaped
(``nvidia.com/gpumem`` without ``~1``) or that assumes a map which is not there fails here as
it would in the kube-apiserver.
"""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fracpilot_actuator.admission import (
    GPU,
    HAMI_CORES,
    HAMI_MEMORY,
    HAMI_MEMORY_PERCENT,
    KAI_CONTAINER,
    KAI_FRACTION,
    KAI_MEMORY,
    KAI_MPS,
    KAI_NUM_DEVICES,
    OPT_OUT,
    TARGET_ANNOTATION,
    AdmissionOutcome,
    MalformedReviewError,
    ServiceReference,
    admit,
    escape_token,
    format_fraction,
    parse_review,
    percent,
    pointer,
    template_patch,
    webhook_configuration,
    workload_candidates,
)
from fracpilot_libs.contracts import GpuSharing, WorkloadRef, WorkloadTarget
from fracpilot_libs.nats import subjects

CLUSTER = "test"
NS = "inference"
CHAT = WorkloadRef(cluster=CLUSTER, namespace=NS, owner_kind="Deployment", owner_name="chat")
HASH = "6b7f9c5d8"
HAMI_SHARES = (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES)
KAI_KEYS = (KAI_FRACTION, KAI_MEMORY, KAI_NUM_DEVICES, KAI_CONTAINER, KAI_MPS)


# --- an RFC 6902 applier --------------------------------------------------------------------------


def parse_pointer(path: str) -> list[str]:
    assert path.startswith("/"), path
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def apply_patch(document: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    doc = copy.deepcopy(document)
    for op in ops:
        tokens = parse_pointer(op["path"])
        parent: Any = doc
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, op["value"])
            elif kind == "remove":
                del parent[index]
            elif kind == "replace":
                parent[index] = op["value"]
            else:
                raise AssertionError(f"unexpected op {op}")
            continue
        assert isinstance(parent, dict), f"{op['path']}: parent is not an object"
        if kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            assert last in parent, f"remove of a missing member {op['path']}"
            del parent[last]
        elif kind == "replace":
            assert last in parent, f"replace of a missing member {op['path']}"
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "test":
            assert parent[last] == op["value"]
        else:
            raise AssertionError(f"unexpected op {op}")
    return doc


def test_the_applier_follows_rfc_6902_and_6901() -> None:
    doc = {"a": {"x/y": 1, "m~n": 2}, "l": [1, 2]}
    out = apply_patch(
        doc,
        [
            {"op": "replace", "path": "/a/x~1y", "value": 3},
            {"op": "remove", "path": "/a/m~0n"},
            {"op": "add", "path": "/l/-", "value": 9},
            {"op": "add", "path": "/b", "value": {"c": 1}},
        ],
    )
    assert out == {"a": {"x/y": 3}, "l": [1, 2, 9], "b": {"c": 1}}
    with pytest.raises(KeyError):
        apply_patch(doc, [{"op": "add", "path": "/a/x/y", "value": 1}])  # unescaped
    with pytest.raises(AssertionError):
        apply_patch(doc, [{"op": "replace", "path": "/a/nope", "value": 1}])


# --- builders -------------------------------------------------------------------------------------


def target(
    fraction: float = 0.375,
    backend: GpuSharing = GpuSharing.KAI,
    memory_mib: int = 30720,
    workload: WorkloadRef = CHAT,
    decision_id: str = "d-42",
) -> WorkloadTarget:
    return WorkloadTarget(
        workload=workload,
        fraction=fraction,
        memory_mib=memory_mib,
        backend=backend,
        decision_id=decision_id,
        updated_at=datetime(2026, 3, 2, tzinfo=UTC),
    )


def targets_of(*items: WorkloadTarget) -> dict[str, WorkloadTarget]:
    return {subjects.kv_key(t.workload): t for t in items}


def owned_by_rs(deployment: str = "chat", template_hash: str = HASH) -> dict[str, Any]:
    return {
        "generateName": f"{deployment}-{template_hash}-",
        "namespace": NS,
        "labels": {"app": deployment, "pod-template-hash": template_hash},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"{deployment}-{template_hash}",
                "uid": "0b6b3f3e-1111-4a4a-9d9d-000000000001",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def kai_pod(fraction: str | None = "0.5", **annotations: str) -> dict[str, Any]:
    meta = owned_by_rs()
    meta["annotations"] = dict(annotations)
    if fraction is not None:
        meta["annotations"][KAI_FRACTION] = fraction
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "server", "image": "vllm", "resources": {}}],
        },
    }


def hami_pod(limits: dict[str, str], requests: dict[str, str] | None = None) -> dict[str, Any]:
    gpu_resources: dict[str, Any] = {"limits": {GPU: "1", **limits}}
    if requests is not None:
        gpu_resources["requests"] = requests
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": owned_by_rs(),
        "spec": {
            "containers": [
                {"name": "sidecar", "image": "envoy", "resources": {"limits": {"cpu": "1"}}},
                {"name": "server", "image": "vllm", "resources": gpu_resources},
            ]
        },
    }


def review(
    pod: dict[str, Any], operation: str = "CREATE", uid: str = "705ab4f5-6393-11e8-b7cc"
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": NS,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    body = response["response"]
    if "patch" not in body:
        return []
    assert body["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(body["patch"]))
    assert isinstance(ops, list)
    return ops


def admitted(
    pod: dict[str, Any], targets: dict[str, WorkloadTarget]
) -> tuple[AdmissionOutcome, dict[str, Any], list[dict[str, Any]]]:
    """Admit ``pod``: the outcome, the pod as stored (patch applied) and the ops."""
    answer = admit(review(pod), targets, CLUSTER)
    response = answer.review
    assert response["apiVersion"] == "admission.k8s.io/v1"
    assert response["kind"] == "AdmissionReview"
    assert response["response"]["allowed"] is True
    assert response["response"]["uid"] == "705ab4f5-6393-11e8-b7cc"
    ops = decoded_patch(response)
    assert ops == list(answer.patch)
    return answer.outcome, apply_patch(pod, ops), ops


def notes_of(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("annotations") or {})


# --- KAI ------------------------------------------------------------------------------------------


def test_kai_fraction_is_written_as_kai_expects() -> None:
    outcome, pod, ops = admitted(kai_pod("0.5", team="a/b"), targets_of(target(0.375)))
    assert outcome is AdmissionOutcome.PATCHED
    assert notes_of(pod) == {KAI_FRACTION: "0.375", TARGET_ANNOTATION: "d-42", "team": "a/b"}
    paths = {op["path"] for op in ops}
    assert paths == {
        "/metadata/annotations/gpu-fraction",
        "/metadata/annotations/fracpilot.io~1target",
    }


def test_kai_gpu_memory_pods_keep_gpu_memory() -> None:
    pod = kai_pod(None, **{KAI_MEMORY: "20000"})
    outcome, stored, _ = admitted(pod, targets_of(target(0.375, memory_mib=30720)))
    assert outcome is AdmissionOutcome.PATCHED
    assert notes_of(stored) == {KAI_MEMORY: "30720", TARGET_ANNOTATION: "d-42"}
    # No memory size in the target: a gpu-memory pod cannot take it.
    outcome, stored, ops = admitted(pod, targets_of(target(0.375, memory_mib=0)))
    assert (outcome, ops) == (AdmissionOutcome.UNCHANGED, [])


def test_kai_whole_gpu_becomes_a_gpu_limit_not_a_fraction_of_one() -> None:
    pod = kai_pod("0.5", **{KAI_NUM_DEVICES: "2", KAI_MPS: "true", "keep": "me"})
    outcome, stored, _ = admitted(pod, targets_of(target(1.0)))
    assert outcome is AdmissionOutcome.PATCHED
    assert notes_of(stored) == {"keep": "me", TARGET_ANNOTATION: "d-42"}
    assert stored["spec"]["containers"][0]["resources"] == {"limits": {GPU: "2"}}
    # Admitted again (reinvocation): nothing more to do.
    outcome, again, ops = admitted(stored, targets_of(target(1.0)))
    assert (outcome, ops, again) == (AdmissionOutcome.UNCHANGED, [], stored)


def test_kai_whole_gpu_goes_to_the_named_container() -> None:
    pod = kai_pod("0.25", **{KAI_CONTAINER: "server"})
    pod["spec"]["containers"].insert(0, {"name": "proxy", "image": "envoy"})
    _, stored, ops = admitted(pod, targets_of(target(1.0)))
    assert stored["spec"]["containers"][1]["resources"]["limits"] == {GPU: "1"}
    assert "resources" not in stored["spec"]["containers"][0]
    assert {"op": "add", "path": "/spec/containers/1/resources/limits", "value": {GPU: "1"}} in ops


def test_kai_whole_gpu_pod_becomes_fractional_only_under_kai_scheduler() -> None:
    pod = kai_pod(None)
    pod["spec"]["containers"] = [
        {"name": "proxy", "image": "envoy"},
        {
            "name": "server",
            "image": "vllm",
            "resources": {"limits": {GPU: "2", "cpu": "4"}, "requests": {GPU: "2"}},
        },
    ]
    outcome, stored, _ = admitted(pod, targets_of(target(0.5)))
    assert outcome is AdmissionOutcome.PATCHED
    assert notes_of(stored) == {
        KAI_FRACTION: "0.5",
        KAI_NUM_DEVICES: "2",
        KAI_CONTAINER: "server",
        TARGET_ANNOTATION: "d-42",
    }
    assert stored["spec"]["containers"][1]["resources"] == {"limits": {"cpu": "4"}, "requests": {}}

    pod["spec"]["schedulerName"] = "default-scheduler"  # the annotation would lose it its GPU
    outcome, stored, ops = admitted(pod, targets_of(target(0.5)))
    assert (outcome, ops) == (AdmissionOutcome.UNCHANGED, [])


def test_already_at_target_only_gets_the_trace_annotation() -> None:
    outcome, stored, ops = admitted(kai_pod("0.375"), targets_of(target(0.375)))
    assert outcome is AdmissionOutcome.UNCHANGED
    assert ops == [
        {"op": "add", "path": "/metadata/annotations/fracpilot.io~1target", "value": "d-42"}
    ]
    outcome, _, ops = admitted(stored, targets_of(target(0.375)))
    assert (outcome, ops) == (AdmissionOutcome.UNCHANGED, [])


def test_a_pod_without_gpu_is_left_alone() -> None:
    pod = kai_pod(None)
    assert admitted(pod, targets_of(target(0.5)))[::2] == (AdmissionOutcome.UNCHANGED, [])
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    hami = target(0.5, backend=GpuSharing.HAMI)
    assert admitted(pod, targets_of(hami))[::2] == (AdmissionOutcome.UNCHANGED, [])


# --- HAMi -----------------------------------------------------------------------------------------


def test_hami_limits_are_set_in_the_gpu_container_with_escaped_paths() -> None:
    pod = hami_pod({HAMI_MEMORY: "4000", HAMI_CORES: "30"}, requests={HAMI_MEMORY: "4000"})
    pod["metadata"]["annotations"] = None  # null annotations
    outcome, stored, ops = admitted(
        pod, targets_of(target(0.25, backend=GpuSharing.HAMI, memory_mib=20480))
    )
    assert outcome is AdmissionOutcome.PATCHED
    server = stored["spec"]["containers"][1]["resources"]
    assert server["limits"] == {GPU: "1", HAMI_MEMORY: "20480", HAMI_CORES: "25"}
    assert server["requests"] == {HAMI_MEMORY: "20480"}  # extended resources: requests = limits
    assert stored["spec"]["containers"][0] == pod["spec"]["containers"][0]
    assert notes_of(stored) == {TARGET_ANNOTATION: "d-42"}
    assert {op["path"] for op in ops} == {
        "/spec/containers/1/resources/limits/nvidia.com~1gpumem",
        "/spec/containers/1/resources/limits/nvidia.com~1gpucores",
        "/spec/containers/1/resources/requests/nvidia.com~1gpumem",
        "/metadata/annotations",
    }


def test_hami_only_touches_what_the_pod_uses() -> None:
    hami = target(0.375, backend=GpuSharing.HAMI, memory_mib=30720)
    _, stored, _ = admitted(hami_pod({HAMI_MEMORY_PERCENT: "50"}), targets_of(hami))
    assert stored["spec"]["containers"][1]["resources"]["limits"] == {
        GPU: "1",
        HAMI_MEMORY_PERCENT: "38",  # 37.5 % rounded up
    }
    outcome, _, ops = admitted(hami_pod({}), targets_of(hami))  # whole GPUs: left alone
    assert (outcome, ops) == (AdmissionOutcome.UNCHANGED, [])
    no_size = target(0.375, backend=GpuSharing.HAMI, memory_mib=0)
    outcome, _, ops = admitted(hami_pod({HAMI_MEMORY: "4000"}), targets_of(no_size))
    assert (outcome, ops) == (AdmissionOutcome.UNCHANGED, [])


# --- who the pod belongs to -----------------------------------------------------------------------


def candidates(meta: dict[str, Any]) -> list[tuple[str, str]]:
    pod = {"metadata": meta}
    return [(w.owner_kind, w.owner_name) for w in workload_candidates(pod, NS, CLUSTER)]


def owner(kind: str, name: str, controller: bool | None = True) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u"}
    if controller is not None:
        ref["controller"] = controller
    return ref


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (owned_by_rs("vllm-llama-3-8b", "7c9d5f8b6d"), [("Deployment", "vllm-llama-3-8b")]),
        # no pod-template-hash label, or one that is not the suffix: a bare ReplicaSet
        (
            {"ownerReferences": [owner("ReplicaSet", "chat-6b7f9c")]},
            [("ReplicaSet", "chat-6b7f9c")],
        ),
        (
            {
                "labels": {"pod-template-hash": "zzz"},
                "ownerReferences": [owner("ReplicaSet", "chat-6b7f9c")],
            },
            [("ReplicaSet", "chat-6b7f9c")],
        ),
        (
            {
                "labels": {"pod-template-hash": "abc"},
                "ownerReferences": [owner("ReplicaSet", "-abc")],
            },
            [("ReplicaSet", "-abc")],
        ),
        ({"ownerReferences": [owner("StatefulSet", "vector-db")]}, [("StatefulSet", "vector-db")]),
        ({"ownerReferences": [owner("DaemonSet", "probe")]}, [("DaemonSet", "probe")]),
        ({"ownerReferences": [owner("Job", "train-run-7")]}, [("Job", "train-run-7")]),
        (
            {"ownerReferences": [owner("Job", "nightly-eval-29001234")]},
            [("Job", "nightly-eval-29001234"), ("CronJob", "nightly-eval")],
        ),
        # the controller reference wins over other owners; one plain owner is taken as is
        (
            {"ownerReferences": [owner("ConfigMap", "x", None), owner("StatefulSet", "db")]},
            [("StatefulSet", "db")],
        ),
        ({"ownerReferences": [owner("StatefulSet", "db", None)]}, [("StatefulSet", "db")]),
        ({"ownerReferences": [owner("A", "a", False), owner("B", "b", False)]}, []),
        ({"generateName": "debug-"}, []),
        ({"name": "chat-6b7f9c5d8-x2k4p"}, []),  # a name is no owner
    ],
)
def test_workload_from_owner_references(meta: dict[str, Any], expected: list[Any]) -> None:
    assert candidates(meta) == expected


def test_a_cronjob_target_reaches_its_jobs_pods() -> None:
    cron = WorkloadRef(cluster=CLUSTER, namespace=NS, owner_kind="CronJob", owner_name="nightly")
    pod = kai_pod("0.5")
    pod["metadata"]["ownerReferences"] = [owner("Job", "nightly-29001234")]
    _, stored, _ = admitted(pod, targets_of(target(0.25, workload=cron, decision_id="d-c")))
    assert notes_of(stored)[KAI_FRACTION] == "0.25"
    assert notes_of(stored)[TARGET_ANNOTATION] == "d-c"


def test_no_owner_or_no_target_or_opted_out_is_left_alone() -> None:
    ours = targets_of(target(0.25))
    orphan = kai_pod("0.5")
    del orphan["metadata"]["ownerReferences"]
    assert admitted(orphan, ours)[::2] == (AdmissionOutcome.NO_TARGET, [])
    other = kai_pod("0.5")
    other["metadata"] = owned_by_rs("embedder") | {"annotations": {KAI_FRACTION: "0.5"}}
    assert admitted(other, ours)[::2] == (AdmissionOutcome.NO_TARGET, [])
    elsewhere = target(0.25, workload=CHAT.model_copy(update={"cluster": "other"}))
    assert admitted(kai_pod("0.5"), targets_of(elsewhere))[::2] == (AdmissionOutcome.NO_TARGET, [])
    for where in ("labels", "annotations"):
        pod = kai_pod("0.5")
        pod["metadata"][where][OPT_OUT] = "true"
        assert admitted(pod, ours)[::2] == (AdmissionOutcome.OPTED_OUT, [])
    pod = kai_pod("0.5")
    pod["metadata"]["labels"][OPT_OUT] = "false"
    assert admitted(pod, ours)[0] is AdmissionOutcome.PATCHED


def test_other_requests_are_allowed_untouched() -> None:
    update = review(kai_pod("0.5"), operation="UPDATE")
    answer = admit(update, targets_of(target(0.25)), CLUSTER)
    assert answer.outcome is AdmissionOutcome.UNCHANGED
    assert answer.review["response"] == {"uid": "705ab4f5-6393-11e8-b7cc", "allowed": True}
    binding = review(kai_pod("0.5"))
    binding["request"]["subResource"] = "binding"
    assert "patch" not in admit(binding, targets_of(target(0.25)), CLUSTER).review["response"]


def test_a_failure_while_patching_still_admits_the_pod() -> None:
    pod = hami_pod({HAMI_CORES: "50"})
    pod["metadata"]["annotations"] = "not a map"  # the trace annotation cannot go in
    answer = admit(review(pod), targets_of(target(0.5, backend=GpuSharing.HAMI)), CLUSTER)
    assert answer.outcome is AdmissionOutcome.ERROR
    assert isinstance(answer.error, ValueError)
    assert answer.review["response"] == {"uid": "705ab4f5-6393-11e8-b7cc", "allowed": True}
    bad_namespace = review(kai_pod("0.5"))
    bad_namespace["request"]["namespace"] = "x" * 64  # WorkloadRef refuses it
    assert admit(bad_namespace, {}, CLUSTER).outcome is AdmissionOutcome.ERROR


# --- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "v1beta1"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "no request"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
            "request.uid",
        ),
    ],
)
def test_malformed_reviews_say_what_is_wrong(body: bytes, message: str) -> None:
    with pytest.raises(MalformedReviewError, match=message):
        parse_review(body)


def test_a_pod_create_without_object_is_malformed() -> None:
    body = review(kai_pod())
    del body["request"]["object"]
    with pytest.raises(MalformedReviewError, match="no object"):
        parse_review(json.dumps(body).encode())
    assert parse_review(json.dumps(review(kai_pod())).encode()) == review(kai_pod())


# --- values ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "text"),
    [(0.375, "0.375"), (0.5, "0.5"), (0.125, "0.125"), (1e-05, "0.00001"), (1 / 3, "0.333333334")],
)
def test_format_fraction_examples(fraction: float, text: str) -> None:
    assert format_fraction(fraction) == text


@given(st.floats(min_value=0.0, max_value=1.0, exclude_min=True, exclude_max=True))
@example(5e-324)
@example(0.9999999999999999)
def test_format_fraction_is_a_plain_quantity_below_one_never_below_the_target(f: float) -> None:
    text = format_fraction(f)
    assert text.startswith("0.")
    assert "e" not in text.lower()
    assert len(text) <= 11  # at most 9 decimal places: a Kubernetes quantity keeps them all
    value = Decimal(text)
    assert 0 < value < 1
    assert value >= Decimal(repr(f)) or value == Decimal("0.999999999")
    assert value - Decimal(repr(f)) <= Decimal("1e-9")


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, float("nan"), float("inf")])
def test_format_fraction_refuses_what_kai_refuses(bad: float) -> None:
    with pytest.raises(ValueError, match="gpu-fraction"):
        format_fraction(bad)


def test_percent_rounds_up_without_float_noise() -> None:
    assert [percent(f) for f in (0.07, 0.375, 0.001, 1.0, 0.29)] == [7, 38, 1, 100, 29]


def test_pointer_escapes_tilde_before_slash() -> None:
    assert escape_token("a~/b") == "a~0~1b"
    assert pointer(("spec", "containers", 0, "resources", "limits", GPU)) == (
        "/spec/containers/0/resources/limits/nvidia.com~1gpu"
    )
    assert parse_pointer(pointer(("~1", "/~0"))) == ["~1", "/~0"]


# --- the configuration ----------------------------------------------------------------------------


def test_webhook_configuration_never_blocks_pods() -> None:
    config = webhook_configuration(ca_bundle=b"PEM", url="https://127.0.0.1:9443/mutate")
    assert config["kind"] == "MutatingWebhookConfiguration"
    assert config["metadata"]["name"] == "fracpilot-targets"
    hook, by_label = config["webhooks"]
    assert (hook["name"], by_label["name"]) == ("targets.fracpilot.io", "pods.targets.fracpilot.io")
    assert {k: v for k, v in by_label.items() if not k.endswith("Selector") and k != "name"} == {
        k: v for k, v in hook.items() if not k.endswith("Selector") and k != "name"
    }
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["timeoutSeconds"] == 5
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["clientConfig"] == {
        "caBundle": base64.b64encode(b"PEM").decode(),
        "url": "https://127.0.0.1:9443/mutate",
    }
    # Recommend-only by default: the pods of namespaces labelled fracpilot.io/mode=auto that do
    # not say otherwise, and pods labelled fracpilot.io/mode=auto elsewhere.
    not_excluded = {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system"],
    }
    not_out = {"key": OPT_OUT, "operator": "NotIn", "values": ["true"]}
    assert hook["namespaceSelector"]["matchExpressions"] == [
        not_excluded,
        {"key": "fracpilot.io/mode", "operator": "In", "values": ["auto"]},
        not_out,
    ]
    assert hook["objectSelector"]["matchExpressions"] == [
        {"key": "fracpilot.io/mode", "operator": "NotIn", "values": ["off", "recommend"]},
        not_out,
    ]
    assert by_label["namespaceSelector"]["matchExpressions"] == [
        not_excluded,
        {"key": "fracpilot.io/mode", "operator": "NotIn", "values": ["auto"]},
        not_out,
    ]
    assert by_label["objectSelector"]["matchExpressions"] == [
        {"key": "fracpilot.io/mode", "operator": "In", "values": ["auto"]},
        not_out,
    ]


def test_webhook_configuration_with_a_service() -> None:
    config = webhook_configuration(
        ca_bundle=b"PEM",
        service=ServiceReference("fracpilot", "fracpilot-actuator-webhook"),
        excluded_namespaces=("kube-system", "fracpilot"),
    )
    hook, _ = config["webhooks"]
    assert hook["clientConfig"]["service"] == {
        "namespace": "fracpilot",
        "name": "fracpilot-actuator-webhook",
        "port": 443,
        "path": "/mutate",
    }
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "fracpilot",
        "kube-system",
    ]
    with pytest.raises(ValueError, match="exactly one"):
        webhook_configuration(ca_bundle=b"PEM")
    with pytest.raises(ValueError, match="https"):
        webhook_configuration(ca_bundle=b"PEM", url="http://127.0.0.1/mutate")


# --- properties -----------------------------------------------------------------------------------

EXTRA_KEYS = ("team", "a/b", "x~y", "~/~1", "nvidia.com/use-gputype", "example.com/note")
Form = str  # "kai-fraction" | "kai-memory" | "whole" | "hami" | "none"


@st.composite
def pods(draw: st.DrawFn) -> tuple[Form, dict[str, Any]]:
    """A valid pod of Deployment chat in one of the GPU forms, with unrelated clutter."""
    form = draw(st.sampled_from(["kai-fraction", "kai-memory", "whole", "hami", "none"]))
    count = draw(st.integers(1, 3))
    gpu_at = draw(st.integers(0, count - 1))
    containers: list[dict[str, Any]] = []
    for i in range(count):
        container: dict[str, Any] = {"name": f"c{i}", "image": "x"}
        if draw(st.booleans()):
            container["resources"] = draw(
                st.sampled_from([{}, {"limits": {"cpu": "1"}}, {"requests": {"memory": "1Gi"}}])
            )
        containers.append(container)
    spec: dict[str, Any] = {"containers": containers}
    if scheduler := draw(st.sampled_from([None, "kai-scheduler", "hami-scheduler"])):
        spec["schedulerName"] = scheduler
    notes = draw(st.dictionaries(st.sampled_from(EXTRA_KEYS), st.text(max_size=4), max_size=3))
    kai_notes: dict[str, str] = {}
    gpu = containers[gpu_at]
    if form == "kai-fraction":
        kai_notes[KAI_FRACTION] = str(draw(st.sampled_from(["0.1", "0.5", "0.875", "0.375"])))
        if draw(st.booleans()):
            kai_notes[KAI_NUM_DEVICES] = str(draw(st.integers(1, 4)))
        if draw(st.booleans()):
            kai_notes[KAI_MPS] = "true"
        if draw(st.booleans()):
            kai_notes[KAI_CONTAINER] = gpu["name"]
    elif form == "kai-memory":
        kai_notes[KAI_MEMORY] = str(draw(st.integers(1, 81920)))
    elif form in ("whole", "hami"):
        devices = str(draw(st.integers(1, 2)))
        limits: dict[str, str] = {GPU: devices}
        if form == "hami":
            for share in draw(st.lists(st.sampled_from(HAMI_SHARES), unique=True)):
                limits[share] = str(draw(st.integers(1, 100 if share != HAMI_MEMORY else 81920)))
            if len(limits) == 1:  # HAMi with no share is whole GPUs
                form = "whole"
        requests = {k: v for k, v in limits.items() if draw(st.booleans())}
        resources = gpu.setdefault("resources", {})
        resources.setdefault("limits", {}).update(limits)
        if requests:
            resources.setdefault("requests", {}).update(requests)
    meta = owned_by_rs()
    all_notes = notes | kai_notes
    empty_map: bool = draw(st.booleans())  # an empty annotations map, or none at all
    if all_notes or empty_map:
        meta["annotations"] = all_notes
    if draw(st.booleans()):
        meta["labels"]["extra/label"] = "v"
    return form, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


workload_targets = st.builds(
    target,
    fraction=st.one_of(
        st.just(1.0),
        st.sampled_from([0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875]),
        st.floats(min_value=0.001, max_value=1.0),
    ),
    backend=st.sampled_from(GpuSharing),
    memory_mib=st.one_of(st.just(0), st.integers(1, 81920)),
    decision_id=st.sampled_from(["d-1", "d/2~x"]),
)

SIZING_ANNOTATIONS = (*KAI_KEYS, TARGET_ANNOTATION)


def without_gpu_sizing(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod minus everything the webhook may change, empty maps dropped."""
    out = copy.deepcopy(pod)
    meta = out["metadata"]
    notes = {k: v for k, v in (meta.pop("annotations", None) or {}).items()}
    notes = {k: v for k, v in notes.items() if k not in SIZING_ANNOTATIONS}
    if notes:
        meta["annotations"] = notes
    for container in out["spec"]["containers"]:
        resources = container.pop("resources", None) or {}
        kept = {}
        for section in ("limits", "requests"):
            values = {k: v for k, v in (resources.get(section) or {}).items()}
            values = {k: v for k, v in values.items() if not k.startswith("nvidia.com/")}
            if values:
                kept[section] = values
        if kept:
            container["resources"] = kept
    return out


def drop_trace(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    notes = out["metadata"].pop("annotations", None) or {}
    notes.pop(TARGET_ANNOTATION, None)
    if notes:
        out["metadata"]["annotations"] = notes
    return out


def kai_refusal(pod: dict[str, Any]) -> str | None:
    """KAI's validating webhook (CREATE and UPDATE) on a pod: why it refuses it, None when it
    accepts it. A line-for-line port of NVIDIA/KAI-scheduler v0.12.0
    ``pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go``
    ``ValidateGpuRequests`` (what ``pkg/admission/webhook/v1alpha2/gpusharing`` calls)."""
    notes = pod["metadata"].get("annotations") or {}
    spec = pod["spec"]
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    whole = any(GPU in ((c.get("resources") or {}).get("limits") or {}) for c in containers)
    fraction, memory = notes.get(KAI_FRACTION), notes.get(KAI_MEMORY)
    fractional = fraction is not None or memory is not None
    if not fractional and notes.get(KAI_MPS) == "true":
        return "MPS is only supported with GPU fraction request"
    if fraction is not None and whole:
        return "cannot have both GPU fraction request and whole GPU resource request/limit"
    if memory is not None and (fraction is not None or whole):
        return "cannot request both GPU and GPU memory"
    if KAI_NUM_DEVICES in notes and not fractional:
        return "cannot request multiple fractional devices without specifying fraction portion"
    if memory is not None and not (memory.isdigit() and int(memory) > 0):
        return "gpu-memory annotation value must be a positive integer greater than 0"
    if fraction is not None:
        try:
            value = float(fraction)  # strconv.ParseFloat
        except ValueError:
            value = 0.0
        if not 0 < value < 1:
            return "gpu-fraction annotation value must be a positive number smaller than 1.0"
    count = notes.get(KAI_NUM_DEVICES)
    if count is not None and not (count.isdigit() and int(count) > 0):
        return "fraction count annotation value must be a positive integer greater than 0"
    return None


def test_kais_validator_refuses_a_gpu_fraction_of_one_and_accepts_the_whole_gpu_form() -> None:
    """Why a target of 1.0 is a recreate to ``nvidia.com/gpu: 1`` (the judge never writes
    ``gpu-fraction: "1"`` in place): KAI refuses that annotation on create and update."""
    pod = kai_pod("0.5")
    assert kai_refusal(pod) is None
    one = copy.deepcopy(pod)
    one["metadata"]["annotations"][KAI_FRACTION] = "1"
    assert kai_refusal(one) == (
        "gpu-fraction annotation value must be a positive number smaller than 1.0"
    )
    _, stored, _ = admitted(pod, targets_of(target(1.0)))
    assert kai_refusal(stored) is None
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}


def gpu_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c for c in pod["spec"]["containers"] if GPU in (c.get("resources") or {}).get("limits", {})
    ]


@settings(max_examples=400, deadline=None)
@given(pods(), workload_targets, st.sampled_from([None, "label", "annotation"]))
def test_the_patch_applies_and_gives_the_pod_its_target(
    form_and_pod: tuple[Form, dict[str, Any]], goal: WorkloadTarget, opt_out: str | None
) -> None:
    form, pod = form_and_pod
    if opt_out == "label":
        pod["metadata"]["labels"][OPT_OUT] = "true"
    elif opt_out == "annotation":
        pod["metadata"].setdefault("annotations", {})[OPT_OUT] = "true"
    outcome, stored, ops = admitted(pod, targets_of(goal))

    # Never anything but the GPU sizing and the trace annotation changes.
    assert without_gpu_sizing(stored) == without_gpu_sizing(pod)
    # The kube-apiserver's rule for extended resources: a request equals its limit.
    for container in stored["spec"]["containers"]:
        resources = container.get("resources") or {}
        for name, value in (resources.get("requests") or {}).items():
            if name.startswith("nvidia.com/"):
                assert resources["limits"][name] == value
    if opt_out:
        assert (outcome, ops) == (AdmissionOutcome.OPTED_OUT, [])
        return
    assert outcome in (AdmissionOutcome.PATCHED, AdmissionOutcome.UNCHANGED)
    notes = notes_of(stored)
    took_it = TARGET_ANNOTATION in notes
    if took_it:
        assert notes[TARGET_ANNOTATION] == goal.decision_id
    else:
        assert ops == []
    assert (outcome is AdmissionOutcome.PATCHED) == (drop_trace(stored) != drop_trace(pod))

    # KAI's rules hold for every stored pod: never gpu-fraction >= 1, never combined; a pod
    # KAI's validating webhook accepted, it accepts once sized.
    if kai_refusal(pod) is None:
        assert kai_refusal(stored) is None
    if KAI_FRACTION in notes:
        assert 0 < Decimal(notes[KAI_FRACTION]) < 1
        assert KAI_MEMORY not in notes
        assert not gpu_containers(stored)

    if goal.backend is GpuSharing.KAI and took_it:
        if form == "kai-memory":
            assert notes[KAI_MEMORY] == str(goal.memory_mib)
        elif goal.fraction < 1:
            assert Decimal(notes[KAI_FRACTION]) == Decimal(format_fraction(goal.fraction))
            assert form in ("kai-fraction", "whole")
        else:
            assert KAI_FRACTION not in notes
            assert KAI_MPS not in notes
            assert gpu_containers(stored)
    if goal.backend is GpuSharing.KAI and not took_it:
        assert form in ("none", "hami", "kai-memory") or (
            form == "whole" and pod["spec"].get("schedulerName") != "kai-scheduler"
        )
    if goal.backend is GpuSharing.HAMI:
        before, after = gpu_containers(pod), gpu_containers(stored)
        assert len(before) == len(after)
        if took_it:
            resources = after[0]["resources"]
            expected = {
                HAMI_MEMORY: str(goal.memory_mib),
                HAMI_MEMORY_PERCENT: str(percent(goal.fraction)),
                HAMI_CORES: str(percent(goal.fraction)),
            }
            for section in ("limits", "requests"):
                for share in HAMI_SHARES:
                    if share in (resources.get(section) or {}) and (
                        share != HAMI_MEMORY or goal.memory_mib
                    ):
                        assert resources[section][share] == expected[share]
            # Only shares the pod already set: none added, none removed.
            assert resources.keys() == before[0]["resources"].keys()
            for section in resources:
                assert resources[section].keys() == before[0]["resources"][section].keys()
        assert after[1:] == before[1:]  # only the first GPU container

    # Idempotent: a reinvoked webhook finds nothing to do.
    outcome_again, again, ops_again = admitted(stored, targets_of(goal))
    assert ops_again == []
    assert again == stored
    assert outcome_again is AdmissionOutcome.UNCHANGED


# --- targets_via=template: the same sizing on a workload's pod template --------------------------


def deployment_of(pod: dict[str, Any]) -> dict[str, Any]:
    template = {"metadata": {"labels": {"app": "chat"}}, "spec": pod["spec"]}
    if annotations := pod["metadata"].get("annotations"):
        template["metadata"]["annotations"] = annotations
    return {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": template}}


def test_template_patch_sizes_the_pod_template_with_paths_from_the_workload() -> None:
    kai = deployment_of(kai_pod("0.5"))
    sizing, ops = template_patch(kai, target(0.375))
    assert (sizing.applies, sizing.reason) == (True, "gpu-fraction 0.375")
    assert all(op["path"].startswith("/spec/template/") for op in ops)
    annotations = apply_patch(kai, ops)["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {KAI_FRACTION: "0.375", TARGET_ANNOTATION: "d-42"}

    hami = deployment_of(hami_pod({HAMI_MEMORY: "20480"}, {HAMI_MEMORY: "20480"}))
    _, ops = template_patch(hami, target(0.125, GpuSharing.HAMI, memory_mib=10240))
    resources = apply_patch(hami, ops)["spec"]["template"]["spec"]["containers"][1]["resources"]
    assert resources["limits"][HAMI_MEMORY] == resources["requests"][HAMI_MEMORY] == "10240"


def test_template_patch_changes_nothing_at_target_or_without_a_gpu_share() -> None:
    sizing, ops = template_patch(deployment_of(kai_pod("0.375")), target(0.375))
    assert (sizing.applies, ops) == (True, [])  # no patch, so no rollout
    sizing, ops = template_patch(deployment_of(kai_pod(None)), target(0.375))
    assert (sizing.applies, sizing.reason, ops) == (False, "the pod requests no GPU", [])
