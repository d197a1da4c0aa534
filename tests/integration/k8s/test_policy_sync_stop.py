"""Policy sync stops though its loop loses the stop's cancel (as the actuator's reconcile loop,
tests/integration/test_actuator_stop.py): a pass awaiting a NATS reply as the stop came went
on, and the loop with it (before the fix this test saw a further pass start after the stop; in
a full ``tests/integration/k8s`` run, nats-py's reply wait lost the stop's cancel in this loop
and the teardown of test_fraction_policy_sync.py's second test did not end in 4 minutes)."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from fracpilot_actuator.policy_sync.controller import PolicySync
from fracpilot_actuator.settings import PolicySyncSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.deadlines import within
from fracpilot_libs.nats.bus import Bus
from helpers import reset_nats, wait_for
from support.policy_crds import install_crds

pytestmark = pytest.mark.integration


async def test_stop_ends_the_loop_though_its_cancel_comes_with_a_reply(
    nats_url: str, kube_admin: client.ApiClient
) -> None:
    install_crds(kube_admin)
    await reset_nats(nats_url)
    bus = Bus("actuator", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect()
    syncer = PolicySync(kube_admin, bus, bus.registry, PolicySyncSettings(resync_s=0.05))
    replies: list[asyncio.Future[None]] = []
    passes_done = 0

    async def pass_awaiting_a_reply() -> None:
        nonlocal passes_done
        replies.append(asyncio.get_running_loop().create_future())
        await asyncio.wait_for(replies[-1], 60)  # as nats-py awaits every reply
        passes_done += 1

    syncer.sync_once = pass_awaiting_a_reply  # type: ignore[method-assign,assignment]
    syncer.start()
    try:
        await wait_for(lambda: bool(replies), timeout=30)  # synced, and a pass awaits its reply
        replies[-1].set_result(None)
        # stop() cancels the loop before its first await: in this loop pass, as the reply comes.
        await within(syncer.stop(), 10)
        # The pass went on to its end (wait_for lost the cancel), and none came after.
        assert (passes_done, len(replies)) == (1, 1)
    finally:
        await syncer.stop()
        await bus.close()
