"""Where a consumed sample goes: decided, skipped as already decided, or refused."""

from __future__ import annotations

import dataclasses

from fracpilot_decision.routing import Route, left_behind_reason, misrouted_reason, route
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.nats import subjects
from fracpilot_libs.sizing.state import WorkloadState

CHAT = WorkloadRef(namespace="inference", owner_name="chat")
SUBJECT = subjects.usage_subject(CHAT)
PARTITIONS = 16
HOME = subjects.usage_partition(CHAT, PARTITIONS)


def test_a_new_workloads_sample_on_its_own_subject_is_decided() -> None:
    assert route(SUBJECT, CHAT, None, 7, PARTITIONS, HOME) is Route.DECIDE


def test_a_sample_on_another_workloads_subject_is_misrouted() -> None:
    other = subjects.usage_subject(WorkloadRef(namespace="inference", owner_name="embed"))
    assert route(other, CHAT, None, 7, PARTITIONS, HOME) is Route.MISROUTED
    assert "inference/chat" in misrouted_reason(CHAT, other)
    assert other in misrouted_reason(CHAT, other)


def test_a_new_workloads_sample_left_in_a_former_partition_is_refused() -> None:
    elsewhere = (HOME + 1) % PARTITIONS
    assert route(SUBJECT, CHAT, None, 7, PARTITIONS, elsewhere) is Route.LEFT_BEHIND
    assert f"usage partition {elsewhere}" in left_behind_reason(elsewhere, PARTITIONS)


def test_a_sample_at_or_before_the_histories_position_is_a_duplicate() -> None:
    state = dataclasses.replace(WorkloadState(), position=7)
    assert route(SUBJECT, CHAT, state, 7, PARTITIONS, HOME) is Route.DUPLICATE
    assert route(SUBJECT, CHAT, state, 6, PARTITIONS, HOME) is Route.DUPLICATE
    assert route(SUBJECT, CHAT, state, 8, PARTITIONS, HOME) is Route.DECIDE


def test_a_known_workload_is_not_checked_for_its_partition_again() -> None:
    state = dataclasses.replace(WorkloadState(), position=1)
    elsewhere = (HOME + 1) % PARTITIONS
    assert route(SUBJECT, CHAT, state, 2, PARTITIONS, elsewhere) is Route.DECIDE
