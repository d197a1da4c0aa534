"""Where a consumed sample goes: decided, skipped as already decided, or refused."""

from __future__ import annotations

import dataclasses

from fracpilot_decision.routing import (
    Route,
    left_behind_reason,
    misrouted_reason,
    route,
    route_batched,
)
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


def test_a_batched_sample_of_a_workload_new_here_is_checked_by_its_slot() -> None:
    wl = CHAT
    mine = subjects.usage_partition(wl, 7)
    other = (mine + 1) % 7
    assert route_batched(wl, None, 5, 7, mine) is Route.DECIDE
    assert route_batched(wl, None, 5, 7, other) is Route.LEFT_BEHIND


def test_a_batched_sample_at_or_before_the_history_is_a_duplicate_unless_decided_here() -> None:
    wl = CHAT
    at_five = WorkloadState(position=5)
    assert route_batched(wl, at_five, 5, 1, 0) is Route.DUPLICATE  # delivered again
    assert route_batched(wl, at_five, 6, 1, 0) is Route.DECIDE
    # A second sample of the workload in the batch at 5, after its first was decided there.
    assert route_batched(wl, at_five, 5, 1, 0, earlier=at_five) is Route.DECIDE
