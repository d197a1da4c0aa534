"""The policy CRDs are generated from Policy: the committed files are what the generator
writes, every Policy field is a spec field (or named as left out, with why), and the schema
says what each field's constraints say.

How the apiserver applies the schema and the CEL rules: tests/integration/k8s/
test_fraction_policies.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from fracpilot_libs.contracts import Policy
from fracpilot_libs.kube import policy_crd, policy_roles
from fracpilot_libs.kube.policy_crd import (
    CLUSTER_KIND,
    NAMESPACED_KIND,
    NOT_IN_SPEC,
    SchemaTranslationError,
    crd,
    spec_fields,
    spec_name,
)

ROOT = Path(__file__).resolve().parents[4]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_policy_crds.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spec_schema(kind: str) -> dict[str, Any]:
    [version] = crd(kind)["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["spec"])


def test_the_committed_files_are_the_generated_ones() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in generator().outputs().items()
        if not path.exists() or path.read_text() != text
    ]
    assert stale == [], "run: .venv/bin/python scripts/gen_policy_crds.py"


@pytest.mark.parametrize("kind", [NAMESPACED_KIND, CLUSTER_KIND])
def test_every_policy_field_is_a_spec_field_or_left_out_with_a_reason(kind: str) -> None:
    properties = spec_schema(kind)["properties"]
    for field in Policy.model_fields:
        assert (spec_name(field) in properties) != (field in NOT_IN_SPEC), field
    extra = set(properties) - {spec_name(f) for f in Policy.model_fields} - {"targetRef"}
    assert extra == set()
    assert (kind == NAMESPACED_KIND) == ("targetRef" in properties)


def test_spec_names_are_camel_case_with_seconds_spelled_out() -> None:
    assert spec_name("min_fraction") == "minFraction"
    assert spec_name("compute_half_life_s") == "computeHalfLifeSeconds"
    assert spec_name("cooldown_s") == "cooldownSeconds"
    assert spec_name("mode") == "mode"
    assert len(set(spec_fields())) == len(Policy.model_fields) - len(NOT_IN_SPEC)


def test_bounds_and_enums_come_from_the_model() -> None:
    props = spec_schema(NAMESPACED_KIND)["properties"]
    assert props["mode"]["enum"] == ["recommend", "auto"]
    assert props["gridSteps"] | {"description": ""} == {
        "type": "integer",
        "minimum": 1,
        "maximum": 100,
        "description": "",
    }
    # gt 0 is an exclusive minimum, spelled as OpenAPI 3.0 spells it
    assert props["minFraction"]["minimum"] == 0.0
    assert props["minFraction"]["exclusiveMinimum"] is True
    assert "default" not in props["minFraction"]  # a field left out takes the model's
    assert f"(default: {Policy().min_fraction})" in props["minFraction"]["description"]


def test_the_schema_is_structural() -> None:
    """Every node has a type; no $ref, anyOf or null types (Kubernetes refuses them)."""

    def walk(node: dict[str, Any], where: str) -> None:
        assert "type" in node, where
        assert not {"$ref", "anyOf", "oneOf", "allOf", "nullable"} & set(node), where
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{where}.{name}")
        if "items" in node:
            walk(node["items"], f"{where}[]")

    for kind in (NAMESPACED_KIND, CLUSTER_KIND):
        [version] = crd(kind)["spec"]["versions"]
        walk(version["schema"]["openAPIV3Schema"], kind)


def test_a_field_with_no_structural_schema_is_refused() -> None:
    class Odd(BaseModel):
        either: int | str = 0

    with pytest.raises(SchemaTranslationError, match="a union of 2 types"):
        policy_crd._openapi(Odd.model_json_schema()["properties"]["either"], {}, "either")


def test_the_printer_columns_read_fields_the_schema_has() -> None:
    [version] = crd(NAMESPACED_KIND)["spec"]["versions"]
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Target", "Mode", "Min", "Max", "In-Force", "Ready", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].split(".")
        if path[1] == "status":
            assert path[2].split("[")[0] in status, column


def test_the_yaml_files_load_back_as_the_crds() -> None:
    for kind in (NAMESPACED_KIND, CLUSTER_KIND):
        assert yaml.safe_load(policy_crd.crd_yaml(kind)) == crd(kind)


def test_the_chart_templates_are_guarded_by_their_values() -> None:
    crds, roles = policy_crd.chart_template(), policy_roles.roles_chart_template()
    assert crds.splitlines()[1] == "{{- if .Values.fractionPolicies.crds.install }}"
    assert "helm.sh/resource-policy: keep" in crds
    assert roles.splitlines()[1] == "{{- if .Values.fractionPolicies.roles }}"


def test_the_roles_aggregate_to_the_standard_ones_and_leave_the_cluster_default_alone() -> None:
    edit, view = policy_roles.policy_roles()
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in edit["metadata"]["labels"] if k.startswith(aggregate)} == {
        f"{aggregate}admin",
        f"{aggregate}edit",
    }
    assert {k for k in view["metadata"]["labels"] if k.startswith(aggregate)} == {
        f"{aggregate}view"
    }
    written = {r for rule in edit["rules"] for r in rule["resources"]}
    assert written == {"fractionpolicies"}  # neither the status nor the cluster default


def test_the_cel_rules_read_the_model_defaults() -> None:
    """The rules' text names each field's default in place of a missing field."""
    rules = [r["rule"] for r in policy_crd.policy_rules()]
    default = Policy()
    assert f"(has(self.minFraction) ? self.minFraction : {default.min_fraction})" in rules[0]
    assert f"(has(self.maxFraction) ? self.maxFraction : {default.max_fraction})" in rules[0]
    assert "(has(self.gridSteps) ? self.gridSteps : 8)" in rules[1]
