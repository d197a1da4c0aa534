"""The lease renewals stop though their cancel is lost.

:meth:`Ownership.stop` ends the renewals last (the leases are renewed while each partition is
handed over) by cancelling their task. A renewal awaits each KV write's reply through nats-py's
``asyncio.wait_for`` (nats-py 2.16.0, nats/aio/client.py ``_request_new_style``), which on
Python 3.11 returns the reply when the cancel comes in the same loop pass
(:mod:`fracpilot_libs.deadlines`): the renewal loop then ran on for ever, renewing the member
key of a replica that was leaving, and the stop (an ingest or decision replica's shutdown) hung.
Same loss as tests/integration/test_actuator_stop.py; here the reply is the member key's write,
held by the test and given right before the stop.
"""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest
from prometheus_client import CollectorRegistry

from fracpilot_decision.metrics import ownership_metrics
from fracpilot_libs.deadlines import within
from fracpilot_libs.leases.ownership import Ownership
from helpers import wait_for
from support.held_kv_put import HeldKvPut

pytestmark = pytest.mark.integration


class Holder:
    async def take(self, partitions: frozenset[int]) -> None:
        pass

    async def hand_over(self, partition: int) -> None:
        pass

    async def drop(self, partition: int) -> None:
        pass


async def test_stop_ends_the_renewals_though_their_cancel_comes_with_a_reply(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nc = await nats.connect(nats_url)
    own = Ownership(
        nc,
        Holder(),
        partitions=2,
        replica="replica-a",
        lease_s=1.0,  # renewed every 0.25 s
        metrics=ownership_metrics(CollectorRegistry()),
        bucket=f"test_renewal_stop_{uuid.uuid4().hex[:8]}",
    )
    await own.open()
    try:
        await own.start()
        # The rounds and the watch end first, as stop() ends them, so that nothing comes
        # between the reply and stop()'s cancel of the renewals.
        for task in own._tasks:
            task.cancel()
        await asyncio.gather(*own._tasks, return_exceptions=True)
        own._tasks.clear()
        assert own.kv is not None
        held = HeldKvPut(own.kv.raw, monkeypatch)  # the member key's next write
        await wait_for(lambda: held.reply is not None)  # a renewal awaits its reply
        assert held.reply is not None
        held.reply.set_result(None)
        # stop() cancels the renewals before its first await: in this loop pass, as the
        # reply comes.
        await within(own.stop(hand_over=False), 10)
        # The renewal went on to its end (wait_for lost the cancel); none came after it.
        assert held.writes == 1
    finally:
        await own.stop(hand_over=False)
        await nc.jetstream().delete_key_value(own.bucket)
        await nc.close()
