"""A stopped standby actuator never starts acting, though its cancel is lost.

The standby task waits for the Lease, then takes up the previous leader's work
(``backend.resume``: KV reads, each reply awaited by nats-py through ``asyncio.wait_for``,
nats-py 2.16.0 nats/aio/client.py ``_request_new_style``) and only then consumes the
decisions. Python 3.11's ``wait_for`` returns the reply when the cancel comes in the same loop
pass (:mod:`fracpilot_libs.deadlines`): a stop that only cancelled the task let it go on and
start consuming after the stop (tests/integration/test_actuator_stop.py: the same loss in the
reconcile loop).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from fracpilot_actuator.actuation import ClusterBackend
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.election.core import ElectionTiming
from fracpilot_actuator.election.elector import LeaderElector
from fracpilot_actuator.election.lease_stores import KubernetesLeaseStore
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.deadlines import within
from helpers import reset_nats, running, wait_for

pytestmark = pytest.mark.integration

LEASE = {"duration_s": 2, "renew_deadline_s": 1.5, "renew_period_s": 0.5, "retry_period_s": 0.25}
TIMING = ElectionTiming(
    lease_duration_s=2, renew_deadline_s=1.5, renew_period_s=0.5, retry_period_s=0.25
)


class ReplyAwaitingResume:
    """The service's own backend, whose resume awaits a reply as nats-py awaits one; the test
    gives the reply."""

    def __init__(self, inner: ClusterBackend) -> None:
        self.inner = inner
        self.reply: asyncio.Future[None] | None = None
        self.resumed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def resume(self, now: datetime) -> None:
        self.reply = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(self.reply, 60)  # as nats-py's request
        self.resumed = True


async def test_a_standby_stopped_as_it_takes_over_does_not_act(
    nats_url: str, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    await reset_nats(nats_url)
    # Another replica leads: the service stands by until it lets go.
    other = LeaderElector(KubernetesLeaseStore(kube_admin, kube_namespace), "other", TIMING)
    await other.start()
    await within(other.wait_for_leadership(), 10)
    settings = ActuatorSettings(
        nats={"url": nats_url},
        backend="kubernetes",
        cluster="test",
        namespace=kube_namespace,
        identity="standby",
        lease=LEASE,
        policysync={"enabled": False, "recommendations": "off"},
    )
    service = ActuatorService(settings, kube_api=kube_admin)
    try:
        async with running(service):
            assert service.elector is not None
            assert service.backend is not None
            assert not service.elector.is_leader
            backend = ReplyAwaitingResume(service.backend)
            service.backend = backend  # type: ignore[assignment]
            await other.stop(release=True)  # hands the Lease over
            await wait_for(lambda: backend.reply is not None)  # leading, resume awaits a reply
            assert backend.reply is not None
            backend.reply.set_result(None)
            # stop() cancels the standby task before its first await: in this loop pass, as
            # the reply comes.
            await within(service.stop(), 10)
            # The resume went on to its end (wait_for lost the cancel); nothing came after it.
            assert backend.resumed
            assert not service.acting.is_set()
    finally:
        await other.stop(release=False)
