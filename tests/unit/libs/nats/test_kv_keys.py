"""Workload keys as NATS KV keys: a safe key is kept as it is, an unsafe character replaced."""

from __future__ import annotations

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.nats import subjects


def test_a_key_of_safe_characters_is_the_workload_key() -> None:
    wl = WorkloadRef(cluster="prod-1", namespace="team-a", owner_name="web.v2")
    assert subjects.kv_key(wl) == "prod-1/team-a/Deployment/web.v2"


def test_characters_kv_refuses_become_underscores() -> None:
    wl = WorkloadRef(cluster="prod 1", namespace="team-a", owner_kind="Job", owner_name="a:b*c")
    assert subjects.kv_key(wl) == "prod_1/team-a/Job/a_b_c"
