"""Which owned partitions one round of the checkpoint schedule writes."""

from __future__ import annotations

from fracpilot_decision.checkpoint_schedule import plan_round
from fracpilot_decision.partition_state import Partition
from fracpilot_decision.settings import CheckpointSettings

SETTINGS = CheckpointSettings(interval_s=60.0, when_idle_s=1.0)
SPACING = 60.0 / 4


def part(number: int, *, committed_at: float, last_sample_at: float, uncommitted: int) -> Partition:
    p = Partition(number)
    p.committed_at, p.last_sample_at, p.uncommitted = committed_at, last_sample_at, uncommitted
    return p


def test_an_urgent_round_writes_every_partition() -> None:
    parts = [part(i, committed_at=100.0, last_sample_at=100.0, uncommitted=0) for i in range(4)]
    plan = plan_round(parts, 101.0, urgent=True, settings=SETTINGS, spacing=SPACING, last_due=0.0)
    assert plan.chosen == parts
    assert plan.overdue is None


def test_a_quiet_partition_with_samples_is_written_at_once() -> None:
    quiet = part(0, committed_at=100.0, last_sample_at=100.0, uncommitted=3)
    busy = part(1, committed_at=100.0, last_sample_at=101.9, uncommitted=3)
    done = part(2, committed_at=100.0, last_sample_at=100.0, uncommitted=0)
    plan = plan_round(
        [quiet, busy, done], 102.0, urgent=False, settings=SETTINGS, spacing=SPACING, last_due=0.0
    )
    assert plan.chosen == [quiet]


def test_busy_partitions_due_are_written_one_per_slot_most_overdue_first() -> None:
    # Samples keep coming (the last one "now" whenever asked): never quiet.
    older = part(0, committed_at=10.0, last_sample_at=1e9, uncommitted=5)
    newer = part(1, committed_at=20.0, last_sample_at=1e9, uncommitted=5)
    first = plan_round(
        [newer, older], 200.0, urgent=False, settings=SETTINGS, spacing=SPACING, last_due=0.0
    )
    assert first.chosen == [older]
    assert first.overdue is older
    assert first.last_due == 200.0
    too_soon = plan_round(
        [newer],
        200.0 + SPACING / 2,
        urgent=False,
        settings=SETTINGS,
        spacing=SPACING,
        last_due=first.last_due,
    )
    assert too_soon.chosen == []
    next_slot = plan_round(
        [newer],
        200.0 + SPACING,
        urgent=False,
        settings=SETTINGS,
        spacing=SPACING,
        last_due=first.last_due,
    )
    assert next_slot.chosen == [newer]
