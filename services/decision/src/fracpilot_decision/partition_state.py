"""What a replica holds for one usage partition it owns, shared by the parts that work on
it: the consumer (:mod:`fracpilot_decision.consumers`), the deciding
(:mod:`fracpilot_decision.deciding`) and the checkpoints
(:mod:`fracpilot_decision.checkpoint_schedule`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field

from fracpilot_libs.nats.client_types import Msg
from fracpilot_libs.nats.pull_feed import PullFeed
from fracpilot_libs.sizing.state import WorkloadState

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Partition:
    """One owned usage partition: its workloads' histories and its consumer."""

    number: int
    states: dict[str, WorkloadState] = field(default_factory=dict)  # by subjects.kv_key
    dirty: set[str] = field(default_factory=set)  # changed since the last checkpoint
    feed: PullFeed | None = None
    stream_made: str = ""  # its stream's creation time: marks name the stream they are of
    task: asyncio.Task[None] | None = None
    lag: asyncio.Task[None] | None = None  # exports the consumer's lag while owned
    last_msg: Msg | None = None  # the last sample handled, not in a checkpoint yet
    uncommitted: int = 0  # messages handled since the last mark
    last_sample_at: float = 0.0  # time.monotonic() of the last batch
    stopping: bool = False  # the worker ends at its next turn (as well as being cancelled)
    committed_at: float = field(default_factory=time.monotonic)
    commit_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def keep(self, states: dict[str, WorkloadState]) -> None:
        """The new histories of one message's samples, kept together (no await between this
        and :meth:`handled`)."""
        self.states.update(states)
        self.dirty.update(states)  # not aliased: a checkpoint may swap the set meanwhile

    def handled(self, msg: Msg) -> None:
        """A message is handled, every sample in it (decided and its state kept, or
        refused): the next mark may pass it. Called only once it is, never before an await
        that could let a checkpoint run between.

        A mark is a stream position: every message up to it handled and the states it
        changed checkpointed. A usage batch is one message, so a mark passes all its
        samples or none; ``uncommitted`` counts messages (what ``max_ack_pending`` counts)."""
        self.last_msg = msg
        self.uncommitted += 1

    def forget_positions(self, beyond: int, why: str) -> None:
        """Positions past ``beyond`` in the partition's stream do not come from it (another
        stream: the earlier layout's, a deleted one, the workload's partition before the
        count changed): they would make new samples look delivered again. A position at or
        before the stream's end when it is claimed is harmless: every new sample comes after.
        The states are checkpointed again, so that a later claim does not bring the stale
        position back once the stream has grown past it."""
        states, stale = self.states, 0
        for key, state in states.items():
            if state.position > beyond:
                states[key] = dataclasses.replace(state, position=0)
                self.dirty.add(key)
                stale += 1
        if stale:
            log.warning(
                "positions forgotten",
                extra={"partition": self.number, "workloads": stale, "why": why},
            )
