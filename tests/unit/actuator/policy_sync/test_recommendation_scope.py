"""Which results become FractionRecommendation objects (policy_sync/recommendations.py): by
default only in namespaces someone opted in, never for a workload that is off; and a 404 of
the resource (its CRD not installed) is told apart from a 404 of one object."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.policy_sync.recommendations import Scope, in_scope, resource_not_served
from fracpilot_actuator.settings import ActuatorSettings, OptInSettings
from fracpilot_libs.contracts import Outcome, PlanKind

HELD = Actuation(PlanKind.IN_PLACE, Outcome.DRY_RUN, "recommend", held_back="not_opted_in")
OFF = Actuation(PlanKind.NONE, Outcome.SKIPPED, "off: opted out", held_back="off")
RECOMMEND = OptInSettings()  # the default mode: recommend
AUTO = OptInSettings(default_mode="auto")
MODE = "fracpilot.io/mode"


def test_the_default_writes_only_where_someone_opted_in() -> None:
    assert ActuatorSettings().policysync.recommendations == "opted-in"


@pytest.mark.parametrize(
    ("scope", "labels", "opt_in", "actuation", "written"),
    [
        # A fresh install: no namespace labelled, nothing written.
        ("opted-in", {}, RECOMMEND, HELD, False),
        # A namespace that asked for recommendations, or for auto: written.
        ("opted-in", {MODE: "recommend"}, RECOMMEND, HELD, True),
        ("opted-in", {MODE: "auto"}, RECOMMEND, HELD, True),
        # The admin made auto the default: every namespace is opted in.
        ("opted-in", {}, AUTO, HELD, True),
        # A label that is not a mode opts nothing in.
        ("opted-in", {MODE: "yes"}, RECOMMEND, HELD, False),
        # Off is off, whatever the scope: a namespace's mode or opt-out, a pod's off.
        ("opted-in", {MODE: "off"}, RECOMMEND, HELD, False),
        ("all", {MODE: "off"}, RECOMMEND, HELD, False),
        ("all", {"fracpilot.io/opt-out": "true"}, RECOMMEND, HELD, False),
        ("all", {MODE: "recommend"}, RECOMMEND, OFF, False),
        ("opted-in", {MODE: "recommend"}, RECOMMEND, OFF, False),
        # all: every workload that is not off.
        ("all", {}, RECOMMEND, HELD, True),
        # off: none.
        ("off", {MODE: "auto"}, AUTO, HELD, False),
    ],
)
def test_which_results_are_written(
    scope: Scope,
    labels: dict[str, str],
    opt_in: OptInSettings,
    actuation: Actuation,
    written: bool,
) -> None:
    assert in_scope(scope, "team-a", labels, opt_in, actuation) is written


def test_an_excluded_namespace_gets_none_even_labelled() -> None:
    excluded = OptInSettings(excluded_namespaces=["kube-system"])
    for scope in ("opted-in", "all"):
        assert not in_scope(scope, "kube-system", {MODE: "auto"}, excluded, HELD)


def not_found(details: dict[str, Any]) -> ApiException:
    exc = ApiException(status=404, reason="Not Found")
    exc.body = json.dumps({"kind": "Status", "reason": "NotFound", "details": details})
    return exc


def test_only_a_404_of_the_resource_itself_says_not_served() -> None:
    # The bodies as kube-apiserver sends them (tests/integration/k8s/
    # test_fraction_recommendations.py meets them live): a path it does not serve (no CRD)
    # gets plain text; a missing object or namespace a Status naming it.
    unserved = ApiException(status=404, reason="Not Found")
    unserved.body = "404 page not found\n"
    assert resource_not_served(unserved)
    assert resource_not_served(not_found({}))  # a Status that names nothing
    named = {"name": "deployment-chat", "group": "fracpilot.io", "kind": "fractionrecommendations"}
    assert not resource_not_served(not_found(named))  # one object
    assert not resource_not_served(not_found({"name": "team-a", "kind": "namespaces"}))
    assert not resource_not_served(ApiException(status=403, reason="Forbidden"))
