"""helm/fracpilot's values and values.schema.json, without helm: the schema accepts the chart's
own values files, refuses wrong ones, and its policy section is the Policy model's.

What helm itself does with them (lint, render, the schema's messages, the apiserver accepting
the objects) is in tests/integration/k8s/test_helm_chart.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from fracpilot_cli.policy import policy_listing
from fracpilot_libs.contracts import (
    MemoryHeadroom,
    MemoryHeadroomMode,
    Mode,
    Policy,
    PolicyLevel,
    PolicyScope,
)

CHART = Path(__file__).resolve().parents[3] / "helm" / "fracpilot"
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
# Policy fields that are not defaults an operator sets (the store sets revision, the chart the
# scope): the schema takes them, as `fracpilot policy get` prints them, values.yaml leaves them out.
NOT_IN_VALUES = {"schema_version", "scope", "revision"}


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Values as helm merges them: maps key by key, anything else replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def errors(values: dict[str, Any]) -> list[str]:
    validator = Draft202012Validator(SCHEMA)
    return sorted(
        f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(values)
    )


def with_value(path: str, value: Any) -> dict[str, Any]:
    values = copy.deepcopy(DEFAULTS)
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
        node = node[key]
    node[leaf] = value
    return values


def test_the_schema_is_a_valid_2020_12_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)


def test_the_default_values_pass_the_schema() -> None:
    assert errors(DEFAULTS) == []


@pytest.mark.parametrize("path", CI_FILES, ids=lambda p: p.name)
def test_every_ci_values_file_passes_the_schema(path: Path) -> None:
    assert errors(merged(DEFAULTS, yaml.safe_load(path.read_text()))) == []


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("actuator.replicas", "two", "actuator/replicas: 'two' is not of type 'integer'"),
        ("policy.mode", "sideways", "policy/mode: 'sideways' is not one of"),
        ("policy.min_fraction", 0, "policy/min_fraction: 0 is less than or equal to"),
        ("policy.grid_steps", 101, "policy/grid_steps: 101 is greater than the maximum of 100"),
        ("ingest.owners", "magic", "ingest/owners: 'magic' is not one of"),
        ("ingest.sources", [], "ingest/sources: [] should be non-empty"),
        ("nats.auth.type", "token", "nats/auth/type: 'token' is not one of"),
        ("webhook.timeoutSeconds", 31, "webhook/timeoutSeconds: 31 is greater than the maximum"),
        ("pricing.gpuPrices", {"H100": -1}, "pricing/gpuPrices/H100: -1 is less than the minimum"),
        ("actuator.replica", 2, "actuator: Additional properties are not allowed ('replica'"),
        (
            "decision.serviceAccount",
            {"create": False, "name": ""},
            "decision/serviceAccount/name: '' should be non-empty",
        ),
        (
            "actuator.serviceAccount",
            {"create": True, "name": "Not_A_Name"},
            "actuator/serviceAccount/name: 'Not_A_Name' does not match",
        ),
        (
            "ingest.topologySpreadConstraints",
            [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}],
            "ingest/topologySpreadConstraints/0: 'topologyKey' is a required property",
        ),
        ("global.imageRegistry", "mirror example", "global/imageRegistry: 'mirror example' does"),
    ],
)
def test_the_schema_refuses_a_wrong_value(path: str, value: Any, expected: str) -> None:
    found = errors(with_value(path, value))
    assert any(e.startswith(expected) for e in found), found


def test_nats_relations_are_enforced() -> None:
    external = merged(DEFAULTS, {"nats": {"deploy": False}})
    assert any(e.startswith("nats/url:") for e in errors(external))
    assert errors(merged(external, {"nats": {"url": "nats://nats.messaging:4222"}})) == []
    creds = merged(external, {"nats": {"url": "nats://n:4222", "auth": {"type": "creds"}}})
    assert any(e.startswith("nats/auth/existingSecret:") for e in errors(creds))
    # The built-in NATS has TLS and one identity per component by default; a certificate of
    # yours (e.g. issued by cert-manager) is taken too.
    assert DEFAULTS["nats"]["auth"]["type"] == "identities"
    assert DEFAULTS["nats"]["tls"]["enabled"] is True
    builtin_tls = merged(DEFAULTS, {"nats": {"tls": {"enabled": True, "existingSecret": "t"}}})
    assert errors(builtin_tls) == []
    builtin_nkey = merged(DEFAULTS, {"nats": {"auth": {"type": "nkey", "existingSecret": "s"}}})
    assert any(e.startswith("nats/auth/type:") for e in errors(builtin_nkey))


def test_several_actuators_need_leader_election() -> None:
    values = merged(DEFAULTS, {"actuator": {"leaderElection": {"enabled": False}}})
    assert any(e.startswith("actuator/replicas: 2 is greater than") for e in errors(values))


# --- the policy section is the Policy model -------------------------------------------------


MODEL_DEFS: dict[str, Any] = Policy.model_json_schema()["$defs"]


def policy_fields() -> dict[str, dict[str, Any]]:
    model = Policy.model_json_schema()
    return {k: v for k, v in model["properties"].items() if k not in NOT_IN_VALUES}


def test_policy_values_are_the_policy_models_defaults() -> None:
    defaults = Policy().model_dump(mode="json", exclude=NOT_IN_VALUES)
    assert DEFAULTS["policy"] == defaults


def assert_same_field(ours: dict[str, Any], field: dict[str, Any], name: str) -> None:
    """The chart's schema of a field says what the model's does: enum, type, bounds."""
    if "$ref" in field:
        target = MODEL_DEFS[field["$ref"].rsplit("/", 1)[-1]]
        if "enum" in target:  # mode, grid, compute_sizing, enforcement, memory_headroom.mode
            assert ours["enum"] == target["enum"], name
            return
        # A nested model (memory_headroom): the same fields, each the same.
        assert ours.get("additionalProperties") is False, name
        assert set(ours["properties"]) == set(target["properties"]), name
        for sub, sub_field in target["properties"].items():
            assert_same_field(ours["properties"][sub], sub_field, f"{name}.{sub}")
        return
    if "anyOf" in field:  # an optional number (resize_budget_per_day): number or null
        (number,) = [f for f in field["anyOf"] if f.get("type") != "null"]
        assert sorted(ours["type"]) == sorted([number["type"], "null"]), name
        field = number
    else:
        assert ours["type"] == field["type"], name
    for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        assert ours.get(bound) == field.get(bound), f"{name}.{bound}"


def test_the_policy_schema_has_the_models_fields_types_and_bounds() -> None:
    chart = SCHEMA["properties"]["policy"]
    assert chart["additionalProperties"] is False
    model = Policy.model_json_schema()["properties"]
    assert set(chart["properties"]) == set(model)
    for name, field in policy_fields().items():
        assert_same_field(chart["properties"][name], field, name)


# --- what `fracpilot policy get` prints pastes into `policy:` -------------------------------


def printed_by_policy_get(policy: Policy) -> dict[str, Any]:
    """What ``fracpilot policy get`` prints for a policy (-o json), parsed: the command's own
    listing (src/fracpilot_cli/policy.py), not a copy of its format."""
    document = policy_listing([policy], one=True).document()
    assert isinstance(document, dict)
    return document


STORED_CLUSTER_POLICY = Policy(
    revision=7,
    mode=Mode.RECOMMEND,
    max_fraction=0.5,
    memory_headroom=MemoryHeadroom(mode=MemoryHeadroomMode.LEARNED, factor=2.0),
    resize_budget_per_day=12,
)


@pytest.mark.parametrize("policy", [Policy(), STORED_CLUSTER_POLICY], ids=["default", "stored"])
def test_the_schema_takes_what_policy_get_prints(policy: Policy) -> None:
    printed = printed_by_policy_get(policy)
    assert {"schema_version", "scope", "revision"} <= set(printed)
    assert errors(merged(DEFAULTS, {"policy": printed})) == []
    # What the decision service reads back is that policy (the chart sets scope and revision).
    assert Policy.model_validate(merged(DEFAULTS["policy"], printed)) == policy


def test_the_schema_refuses_a_namespace_policy_in_the_cluster_default() -> None:
    """`policy get -n team-a` prints a namespace's policy: not the cluster default."""
    scope = PolicyScope(level=PolicyLevel.NAMESPACE, namespace="team-a")
    printed = printed_by_policy_get(Policy(scope=scope))
    found = errors(merged(DEFAULTS, {"policy": printed}))
    assert any(e.startswith("policy/scope/level: 'cluster' was expected") for e in found), found
