"""The checkpoint schedule stops though its cancel is lost.

A checkpoint's mark is a KV put, whose reply nats-py awaits through ``asyncio.wait_for``
(nats-py 2.16.0, nats/aio/client.py ``_request_new_style``), which on Python 3.11 returns the
reply when the cancel comes in the same loop pass (:mod:`fracpilot_libs.deadlines`). A stop
that only cancelled the schedule's task left its loop checkpointing after the stop, and the
decision replica's stop waiting for it. Same loss as tests/integration/test_actuator_stop.py;
here the reply is the mark's write, held by the test and given right before the stop.
"""

from __future__ import annotations

import nats
import pytest
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from fracpilot_decision.checkpoint_schedule import CheckpointScheduler
from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_decision.partition_state import Partition
from fracpilot_decision.settings import CheckpointSettings
from fracpilot_libs.deadlines import within
from helpers import reset_nats, wait_for
from support.held_kv_put import HeldKvPut

pytestmark = pytest.mark.integration


def handled(nc: nats.NATS, seq: int) -> Msg:
    """A message as the partition's consumer got it: the mark is its stream position."""
    return Msg(nc, subject="usage", reply=f"$JS.ACK.usage.decision.1.{seq}.{seq}.0.0")


async def test_stop_ends_the_schedule_though_its_cancel_comes_with_a_reply(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await reset_nats(nats_url)
    nc = await nats.connect(nats_url)
    try:
        checkpoints = Checkpointer(nc, CollectorRegistry())
        await checkpoints.open()
        part = Partition(0, last_msg=handled(nc, 10), uncommitted=1)
        # Each write hands the partition a newer message: every round has a mark to write.
        held = HeldKvPut(
            checkpoints.kv.raw,
            monkeypatch,
            lambda writes: setattr(part, "last_msg", handled(nc, 10 + writes)),
        )
        # A round every 0.05 s, each writing the partition's mark.
        scheduler = CheckpointScheduler(
            checkpoints,
            {0: part},
            lambda _: True,
            CheckpointSettings(interval_s=0.05, when_idle_s=0),
            partition_count=1,
        )
        scheduler.start()
        await wait_for(lambda: held.reply is not None)  # a mark awaits its reply
        assert held.reply is not None
        held.reply.set_result(None)
        # stop() cancels the schedule before its first await: in this loop pass, as the
        # reply comes.
        await within(scheduler.stop(), 10)
        # That write went on to its end (wait_for lost the cancel); none came after it.
        assert held.writes == 1
    finally:
        await nc.close()
