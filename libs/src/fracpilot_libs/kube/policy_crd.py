"""The policy CRDs (``FractionPolicy``, ``ClusterFractionPolicy``), generated from ``Policy``.

Every field of :class:`~fracpilot_libs.contracts.Policy` but the three in :data:`NOT_IN_SPEC`
is a field of the objects' ``spec``, spelled in camelCase (a trailing ``_s`` becomes
``Seconds``: ``cooldown_s`` -> ``cooldownSeconds``). The OpenAPI v3 schema of each field is
translated from the model's JSON schema (bounds, enums, types), and the cross-field rules of
``Policy`` that a schema cannot state (``min_fraction <= max_fraction``, both on the grid) are
``x-kubernetes-validations`` CEL rules, with the model's defaults standing in for fields left
out. The schema has no ``default``s on purpose: a field left out takes the model's default
when the policy is synced, so an object does not pin a default of the version it was written
with. ``scripts/gen_policy_crds.py`` writes the YAML (deploy/crds/ and the chart); a test
compares the committed files with :func:`crd` so that they cannot drift from the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

from fracpilot_libs.contracts import BACKEND_GRID_STEPS, GridKind, Policy

GROUP = "fracpilot.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
NAMESPACED_KIND = "FractionPolicy"
NAMESPACED_PLURAL = "fractionpolicies"
CLUSTER_KIND = "ClusterFractionPolicy"
CLUSTER_PLURAL = "clusterfractionpolicies"
CLUSTER_DEFAULT_NAME = "default"  # the one ClusterFractionPolicy

# Policy fields that are not spec fields, and why.
NOT_IN_SPEC: Mapping[str, str] = {
    "schema_version": "the wire format's version, not a policy setting",
    "scope": "the object's kind, namespace and spec.targetRef say it",
    "revision": "numbered by the sync (status.policyRevision)",
}

# spec.targetRef.name names a workload as a policy scope key can (PolicyScope.key).
TARGET_NAME_PATTERN = r"^[-/_=A-Za-z0-9]+(\.[-/_=A-Za-z0-9]+)*$"
# Kinds a pod's owner chain ends at (fracpilot_libs.owners): with one, the scope is that kind's
# workload (PolicyScope.kind, matched against WorkloadRef.owner_kind).
TARGET_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicaSet", "Pod")

_KEPT = (
    *("type", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern"),
    *("minItems", "maxItems", "uniqueItems", "format"),
)


class SchemaTranslationError(ValueError):
    """A Policy field whose JSON schema has no structural OpenAPI counterpart here."""


def spec_name(field: str) -> str:
    """The spec field of a Policy field: camelCase, ``_s`` spelled ``Seconds``."""
    head, *rest = re.sub(r"_s$", "_seconds", field).split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def spec_fields() -> dict[str, str]:
    """spec field -> Policy field, for every Policy field but :data:`NOT_IN_SPEC`."""
    return {spec_name(f): f for f in Policy.model_fields if f not in NOT_IN_SPEC}


# --- the JSON schema of Policy, as a structural OpenAPI v3 schema ---------------------------


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = dict(defs[node["$ref"].rsplit("/", 1)[-1]])
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return dict(node)


def _openapi(node: Mapping[str, Any], defs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One JSON-schema node (pydantic's, draft 2020-12) as OpenAPI v3.0 (Kubernetes')."""
    node = _resolve(node, defs)
    if "anyOf" in node:  # X | None: Kubernetes has no null-typed fields; leave it out instead
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaTranslationError(f"{where}: a union of {len(options)} types")
        return _openapi({**options[0], "description": node.get("description", "")}, defs, where)
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    out: dict[str, Any] = {k: node[k] for k in _KEPT if k in node}
    for bound, keyword in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node:  # 2020-12 spells the bound here; OpenAPI 3.0 flags the plain one
            out[keyword] = node[bound]
            out[bound] = True
    if "type" not in out:
        raise SchemaTranslationError(f"{where}: no type in {sorted(node)}")
    if out["type"] == "array":
        out["items"] = _openapi(node.get("items", {}), defs, f"{where}[]")
    if out["type"] == "object":
        props = node.get("properties")
        if props:
            out["properties"] = {
                spec_name(k): _openapi(v, defs, f"{where}.{k}") for k, v in props.items()
            }
            if required := node.get("required"):
                out["required"] = [spec_name(r) for r in required]
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = _openapi(node["additionalProperties"], defs, where)
        else:
            raise SchemaTranslationError(f"{where}: an object without a schema")
    if description := node.get("description"):
        out["description"] = description
    return out


def spec_words(text: str) -> str:
    """``text`` with every Policy field it names spelled as the spec spells it."""
    names = {f: spec_name(f) for f in Policy.model_fields}
    return re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda m: names.get(m[0], m[0]), text)


def _with_default(schema: dict[str, Any], default: Any) -> dict[str, Any]:
    if isinstance(default, tuple | list):
        shown = json.dumps(list(default))
    else:
        shown = default.value if hasattr(default, "value") else default
    text = spec_words(schema.get("description", ""))
    return {**schema, "description": f"{text} (default: {shown})".strip()}


def policy_properties() -> dict[str, Any]:
    """The spec's schema of every Policy setting (see the module doc)."""
    json_schema = Policy.model_json_schema()
    defs = json_schema.get("$defs", {})
    out = {}
    for spec, field in spec_fields().items():
        schema = _openapi(json_schema["properties"][field], defs, field)
        out[spec] = _with_default(schema, Policy.model_fields[field].default)
    return out


def _or_default(field: str) -> str:
    default = Policy.model_fields[field].default
    literal = repr(float(default)) if isinstance(default, float) else str(default)
    return f"(has(self.{spec_name(field)}) ? self.{spec_name(field)} : {literal})"


def _rule(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message, "reason": "FieldValueInvalid"}


def _near(a: str, b: str) -> str:
    """CEL: ``a`` within 1e-9 of ``b`` (Policy's tolerance)."""
    return f"({a} - {b}) < 1e-9 && ({a} - {b}) > -1e-9"


def policy_rules() -> list[dict[str, str]]:
    """CEL rules for what Policy's model validators check across fields, written beside them
    (contracts.Policy._bounds_valid, _grid_of_older_policies): a missing field is its
    default. The apiserver test (test_fraction_policies.py) sends a corpus of specs to the
    apiserver and to Policy and requires the same verdicts, so a validator changed without
    its rule here fails there."""
    fields = set(spec_fields().values())
    rules = []
    if {"min_fraction", "max_fraction"} <= fields:
        rules.append(
            _rule(
                f"{_or_default('min_fraction')} <= {_or_default('max_fraction')}",
                "minFraction must not be above maxFraction",
            )
        )
    if not {"grid", "grid_steps", "grid_levels", "min_fraction", "max_fraction"} <= fields:
        return rules
    # A policy that gives gridSteps and no grid means the steps grid (written before grids).
    implied = f"(has(self.gridSteps) ? '{GridKind.STEPS}' : '{GridKind.BACKEND}')"
    grid = f"(has(self.grid) ? self.grid : {implied})"
    levels = f"{grid} == '{GridKind.LEVELS}'"
    steps = (
        f"({grid} == '{GridKind.STEPS}' ? double({_or_default('grid_steps')}) : "
        f"{float(BACKEND_GRID_STEPS)})"
    )
    for field in ("min_fraction", "max_fraction"):
        name, value = spec_name(field), _or_default(field)
        # on a grid of steps: value * steps is a whole number (int() truncates; the product
        # is positive, so int(v + 0.5) is the nearest one)
        v = f"{value} * {steps}"
        rules.append(
            _rule(f"{levels} || ({_near(v, f'double(int({v} + 0.5))')})", f"{name} is off the grid")
        )
        rules.append(
            _rule(
                f"!({levels}) || !has(self.gridLevels) || "
                f"self.gridLevels.exists(l, {_near(value, 'l')})",
                f"{name} must be one of gridLevels",
            )
        )
    rules.append(
        _rule(
            f"!({levels}) || (has(self.gridLevels) && size(self.gridLevels) > 0)",
            "grid levels needs gridLevels (the fractions allowed)",
        )
    )
    rules.append(
        _rule(
            f"!({levels}) || !has(self.gridLevels) || (self.gridLevels.isSorted() && "
            "self.gridLevels.all(x, self.gridLevels.exists_one(y, y == x)))",
            "gridLevels must be strictly ascending",
        )
    )
    return rules


# --- the CRDs ---------------------------------------------------------------------------------

_TARGET_REF = {
    "type": "object",
    "description": "The workload this policy sizes; left out, every workload of the namespace "
    "(a policy for one workload wins over the namespace's). With kind, only the workload of "
    "that kind and name (a Deployment and a StatefulSet may share a name); without, every "
    "workload of that name (a policy naming the kind wins over one that does not).",
    "required": ["name"],
    "properties": {
        "apiVersion": {"type": "string", "description": "its API version (informational)"},
        "kind": {
            "type": "string",
            "enum": list(TARGET_KINDS),
            "description": "its kind, the kind its pods' owner chain ends at (a Deployment's "
            "pods: Deployment); left out: any kind",
        },
        "name": {
            "type": "string",
            "minLength": 1,
            "maxLength": 253,
            "pattern": TARGET_NAME_PATTERN,
            "description": "the workload's name (a pod's top owner)",
        },
    },
}

_CONDITION = {
    "type": "object",
    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
    "properties": {
        "type": {"type": "string", "maxLength": 316},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "maxLength": 1024},
        "message": {"type": "string", "maxLength": 32768},
    },
}

_STATUS = {
    "type": "object",
    "description": "Written by the fracpilot actuator (policy sync).",
    "properties": {
        "observedGeneration": {"type": "integer", "format": "int64"},
        "scope": {"type": "string", "description": "the policy scope key"},
        "target": {"type": "string", "description": "what the policy sizes"},
        "inForce": {
            "type": "string",
            "description": "the policy source in force at this scope: this object, another "
            "one, nats (a policy set with `fracpilot policy set`) or default",
        },
        "policyRevision": {"type": "integer", "format": "int64"},
        "mode": {"type": "string"},
        "minFraction": {"type": "number"},
        "maxFraction": {"type": "number"},
        "conditions": {
            "type": "array",
            "items": _CONDITION,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    },
}


def _columns() -> list[dict[str, Any]]:
    ready = '.status.conditions[?(@.type=="Ready")].status'
    return [
        {"name": "Target", "type": "string", "jsonPath": ".status.target"},
        {"name": "Mode", "type": "string", "jsonPath": ".status.mode"},
        {"name": "Min", "type": "number", "jsonPath": ".status.minFraction"},
        {"name": "Max", "type": "number", "jsonPath": ".status.maxFraction"},
        {"name": "In-Force", "type": "string", "jsonPath": ".status.inForce"},
        {"name": "Ready", "type": "string", "jsonPath": ready},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def crd(kind: str) -> dict[str, Any]:
    """The CustomResourceDefinition of ``kind`` (:data:`NAMESPACED_KIND` or
    :data:`CLUSTER_KIND`) as a dict, ready to dump as YAML."""
    namespaced = kind == NAMESPACED_KIND
    if not namespaced and kind != CLUSTER_KIND:
        raise ValueError(f"unknown policy kind {kind!r}")
    plural = NAMESPACED_PLURAL if namespaced else CLUSTER_PLURAL
    spec: dict[str, Any] = {
        "type": "object",
        "properties": policy_properties(),
        "x-kubernetes-validations": policy_rules(),
    }
    if namespaced:
        spec["properties"] = {"targetRef": _TARGET_REF, **spec["properties"]}
        spec["description"] = "How fracpilot sizes the GPU fraction of the namespace's workloads."
    else:
        spec["description"] = "How fracpilot sizes every workload without a FractionPolicy."
    root: dict[str, Any] = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": _STATUS,
        },
    }
    if not namespaced:
        root["x-kubernetes-validations"] = [
            {
                "rule": f"self.metadata.name == '{CLUSTER_DEFAULT_NAME}'",
                "message": f"the one {CLUSTER_KIND} is named '{CLUSTER_DEFAULT_NAME}'",
                "reason": "FieldValueInvalid",
            }
        ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if namespaced else "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": ["fpol"] if namespaced else ["cfpol"],
                "categories": ["fracpilot"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _columns(),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = (
    "# GENERATED by scripts/gen_policy_crds.py from fracpilot_libs.contracts.Policy "
    "(fracpilot_libs.kube.policy_crd): do not edit.\n"
)


def crd_yaml(kind: str) -> str:
    return HEADER + yaml.safe_dump(crd(kind), sort_keys=False, width=100)


def chart_template() -> str:
    """Both CRDs as the chart's template: installed unless ``fractionPolicies.crds.install``
    is false, kept on uninstall (the policies in them would go with them) unless
    ``fractionPolicies.crds.keep`` is false; upgraded with the chart (a ``crds/`` directory
    never is, and a new Policy field would be pruned by an old schema)."""
    docs = []
    for kind in (NAMESPACED_KIND, CLUSTER_KIND):
        body = yaml.safe_dump(crd(kind), sort_keys=False, width=100)
        name = crd(kind)["metadata"]["name"]
        meta = (
            f"metadata:\n  name: {name}\n"
            '  labels:\n    {{- include "fracpilot.labels" (list $ "policies") | nindent 4 }}\n'
            "  {{- if .Values.fractionPolicies.crds.keep }}\n"
            "  annotations:\n    helm.sh/resource-policy: keep\n  {{- end }}\n"
        )
        docs.append(body.replace(f"metadata:\n  name: {name}\n", meta, 1))
    return (
        "{{- /* " + HEADER.strip("# \n") + " */}}\n"
        "{{- if .Values.fractionPolicies.crds.install }}\n" + "---\n".join(docs) + "{{- end }}\n"
    )
