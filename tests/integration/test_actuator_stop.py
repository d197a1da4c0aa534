"""The actuator stops though its reconcile loop loses the stop's cancel.

nats-py awaits every reply (each KV write, each JetStream publish) through ``asyncio.wait_for``
(nats-py 2.16.0, nats/aio/client.py ``_request_new_style``: ``return await
asyncio.wait_for(future, timeout)``), and Python 3.11's ``wait_for`` returns the reply when a
cancel comes in the same loop pass (:mod:`fracpilot_libs.deadlines`). A stop that only
cancelled the reconcile task then waited for a loop that ran on: in a full
``tests/integration/k8s`` run the scale-up test's actuator, stopped just as its recreate record
was saved, did not stop in 30 s and left its watches and its Lease thread open.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from fracpilot_actuator.actuation import ClusterBackend
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.deadlines import within
from helpers import reset_nats, running, wait_for

pytestmark = pytest.mark.integration


class ReplyAwaitingBackend:
    """The service's own backend, whose reconcile awaits a reply as nats-py awaits one; the
    test gives the reply."""

    def __init__(self, inner: ClusterBackend) -> None:
        self.inner = inner
        self.reply: asyncio.Future[None] | None = None
        self.rounds_done = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def reconcile(self, now: datetime) -> None:
        self.reply = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(self.reply, 60)  # as nats-py's request
        self.rounds_done += 1


async def test_stop_ends_the_reconcile_loop_though_its_cancel_comes_with_a_reply(
    nats_url: str,
) -> None:
    await reset_nats(nats_url)
    settings = ActuatorSettings(nats={"url": nats_url}, capacity={"poll_s": 0.05})
    service = ActuatorService(settings)
    async with running(service):
        assert service.handler is not None
        backend = ReplyAwaitingBackend(service.handler.backend)
        service.handler.backend = backend  # type: ignore[assignment]
        await wait_for(lambda: backend.reply is not None)  # a round awaits its reply
        assert backend.reply is not None
        backend.reply.set_result(None)
        # stop() cancels the reconcile task before its first await: in this loop pass, as the
        # reply comes.
        await within(service.stop(), 10)
        # The round went on to its end (wait_for lost the cancel), and no round came after.
        assert backend.rounds_done == 1
