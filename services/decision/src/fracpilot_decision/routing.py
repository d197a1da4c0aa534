"""Where a consumed sample goes: decided, skipped as already decided, or refused. Pure.

A sample is refused when its subject is not its workload's (``misrouted``: it would land in
the wrong partition), or when it was stored in this partition before the partition count
changed and its workload is decided in another partition now (``left behind``).
"""

from __future__ import annotations

from enum import Enum

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.nats import subjects
from fracpilot_libs.sizing.state import WorkloadState


class Route(Enum):
    DECIDE = "decide"
    DUPLICATE = "duplicate"  # already in the history (delivered again after a move)
    MISROUTED = "misrouted"
    LEFT_BEHIND = "left_behind"


def route(
    subject: str,
    workload: WorkloadRef,
    state: WorkloadState | None,
    seq: int,
    partitions: int,
    partition: int,
) -> Route:
    """The route of the sample stored at ``seq`` on ``subject`` in ``partition`` (of
    ``partitions``), ``state`` being its workload's history here (None: new here)."""
    first = state is None
    if not subjects.on_own_subject(
        subject, workload.namespace, workload.owner_name, slot_too=first
    ):
        return Route.MISROUTED
    if first and subjects.of_another_partition(subject, partitions, partition):
        return Route.LEFT_BEHIND
    if state is not None and state.position >= seq:
        return Route.DUPLICATE
    return Route.DECIDE


def route_batched(
    workload: WorkloadRef,
    state: WorkloadState | None,
    seq: int,
    partitions: int,
    partition: int,
    earlier: WorkloadState | None = None,
) -> Route:
    """The route of a sample in the usage batch stored at ``seq`` in ``partition``.

    A batch's subject names its partition, not the workload: a workload new here is checked
    against the partition by its slot (refused as left behind when it is another's: the
    publisher grouped by an earlier count). ``earlier``: the workload's history after a sample
    before this one in the same batch, at ``seq`` already and not a duplicate for that."""
    if earlier is not None:
        return Route.DECIDE
    if state is None:
        if subjects.usage_partition(workload, partitions) != partition:
            return Route.LEFT_BEHIND
        return Route.DECIDE
    if state.position >= seq:
        return Route.DUPLICATE
    return Route.DECIDE


def misrouted_reason(workload: WorkloadRef, subject: str) -> str:
    return (
        f"a sample of workload {workload.namespace}/{workload.owner_name} published on "
        f"{subject}: samples go on subjects.usage_subject(workload), which keeps each "
        "workload in its partition"
    )


def left_behind_reason(partition: int, partitions: int) -> str:
    return (
        f"a sample stored in usage partition {partition} before the partition count "
        f"became {partitions}: its workload is decided in another partition "
        "now (change the count with the decision service caught up: docs/performance.md)"
    )
