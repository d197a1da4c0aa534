"""A service shutting down is not made ready again though the readiness loop's cancel is lost.

The loop that keeps ``/readyz`` asks JetStream whether it answers (``nc.request``, whose reply
nats-py awaits through ``asyncio.wait_for``, nats-py 2.16.0 nats/aio/client.py
``_request_new_style``); on Python 3.11 ``wait_for`` returns the reply when the cancel comes in
the same loop pass (:mod:`fracpilot_libs.deadlines`). The loop, cancelled as the shutdown began,
then went on and, JetStream answering again, said ready after "shutting down". Same loss as
tests/integration/test_actuator_stop.py.
"""

from __future__ import annotations

import asyncio

import pytest

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.deadlines import within
from fracpilot_libs.runtime import ServiceRuntime
from helpers import wait_for

pytestmark = pytest.mark.integration


async def test_shutdown_is_not_undone_though_the_readiness_cancel_comes_with_a_reply(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = ServiceRuntime("test", ServiceSettings(nats={"url": nats_url}))
    asks = 0
    reply: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def jetstream_available(timeout_s: float = 2.0) -> bool:
        """JetStream unavailable at first; the second answer, that it is back, the test gives
        as nats-py gives a reply."""
        nonlocal asks
        asks += 1
        if asks == 1:
            return False
        return await asyncio.wait_for(reply, 60)  # as nats-py's request

    monkeypatch.setattr(runtime.bus, "jetstream_available", jetstream_available)
    said: list[tuple[bool, str]] = []
    set_ready = runtime.health.set_ready

    def record(ready: bool, reason: str = "") -> None:
        said.append((ready, reason))
        set_ready(ready, reason)

    monkeypatch.setattr(runtime.health, "set_ready", record)

    async def start() -> None:
        pass

    task = asyncio.create_task(runtime.run(start, install_signals=False))
    await wait_for(lambda: asks == 2, timeout=10)  # not ready; JetStream asked again
    assert said[-1] == (False, "JetStream unavailable")
    # The answer and the shutdown in one loop pass: the loop is cancelled as the reply comes.
    reply.set_result(True)
    runtime.stop_requested.set()
    await within(task, 10)
    shutting_down = said.index((False, "shutting down"))
    assert not any(ready for ready, _ in said[shutting_down:]), said
