"""Leader election on a real Lease: one of two actuators leads, the other takes over when it dies
(within the lease duration) or hands over (within a retry period); never both at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from kubernetes import client

from fracpilot_actuator.election.core import (
    DEFAULT_LEASE_NAME,
    ElectionTiming,
    RoundOutcome,
)
from fracpilot_actuator.election.elector import (
    LeaderElector,
)
from fracpilot_actuator.election.lease_stores import KubernetesLeaseStore, SeverableLeaseStore
from k8s_control_plane import ControlPlane

pytestmark = pytest.mark.integration

FAST = ElectionTiming(
    lease_duration_s=2, renew_deadline_s=1.5, renew_period_s=0.5, retry_period_s=0.25
)
DEFAULT = ElectionTiming()  # 15 s lease, 10 s deadline, renew every 5 s, retry every 2 s
# What a round costs on top of the timing: a read and a write on loopback, and the loop's wake-up.
SLACK_S = 0.25


class Observer:
    """Samples both electors every millisecond: who leads, and any instant where both do."""

    def __init__(self, electors: list[LeaderElector]) -> None:
        self.electors = electors
        self.overlaps = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            if sum(e.is_leader for e in self.electors) > 1:
                self.overlaps += 1
            await asyncio.sleep(0.001)

    def __enter__(self) -> Observer:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def seconds_until(condition: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    async with asyncio.timeout(timeout):
        while True:
            if condition():
                return time.monotonic() - start
            await asyncio.sleep(0.001)


@asynccontextmanager
async def elector(
    kube: ControlPlane, namespace: str, identity: str, timing: ElectionTiming
) -> AsyncIterator[LeaderElector]:
    with kube.admin_client() as api:
        running = LeaderElector(KubernetesLeaseStore(api, namespace), identity, timing)
        await running.start()
        try:
            yield running
        finally:
            await running.stop(release=False)  # idempotent when the test stopped it already


def read_lease(kube_admin: client.ApiClient, namespace: str) -> client.V1LeaseSpec:
    lease = client.CoordinationV1Api(kube_admin).read_namespaced_lease(
        DEFAULT_LEASE_NAME, namespace
    )
    assert lease.spec is not None
    return lease.spec


async def just_renewed(leader: LeaderElector, timeout: float) -> None:
    """Return right after the leader's next renewal: killing it then is the worst case."""
    before = leader.last_result

    def renewed() -> bool:
        now = leader.last_result
        return now is not before and now is not None and now.outcome is RoundOutcome.RENEWED

    await seconds_until(renewed, timeout)


@pytest.mark.parametrize("timing", [FAST, DEFAULT], ids=["lease-2s", "lease-15s-default"])
async def test_the_standby_takes_over_from_a_killed_leader_within_the_lease(
    kube: ControlPlane, kube_admin: client.ApiClient, kube_namespace: str, timing: ElectionTiming
) -> None:
    async with (
        elector(kube, kube_namespace, "actuator-a", timing) as a,
        elector(kube, kube_namespace, "actuator-b", timing) as b,
    ):
        with Observer([a, b]) as observer:
            await seconds_until(lambda: a.is_leader or b.is_leader, timeout=5)
            await asyncio.sleep(timing.retry_period_s * 2)  # both have run rounds by now
            assert [a.is_leader, b.is_leader].count(True) == 1
            leader, standby = (a, b) if a.is_leader else (b, a)
            assert read_lease(kube_admin, kube_namespace).holder_identity == leader.identity

            await just_renewed(leader, timeout=timing.renew_period_s + 2)
            killed = time.monotonic()
            await leader.stop(release=False)  # dies: no release, the Lease must run out
            await seconds_until(lambda: standby.is_leader, timeout=timing.lease_duration_s + 5)
            takeover = time.monotonic() - killed

        assert observer.overlaps == 0
        spec = read_lease(kube_admin, kube_namespace)
        assert (spec.holder_identity, spec.lease_transitions) == (standby.identity, 1)
        print(f"\n[{timing.lease_duration_s} s lease] takeover after a kill: {takeover:.3f} s")
        # The standby retries right when the Lease runs out, so the kill costs the lease
        # duration (measured from the last renewal) and one round trip.
        assert takeover >= timing.lease_duration_s - SLACK_S
        assert takeover <= timing.lease_duration_s + timing.retry_period_s


@pytest.mark.parametrize("timing", [FAST, DEFAULT], ids=["lease-2s", "lease-15s-default"])
async def test_a_graceful_stop_hands_over_within_a_retry_period(
    kube: ControlPlane, kube_admin: client.ApiClient, kube_namespace: str, timing: ElectionTiming
) -> None:
    async with (
        elector(kube, kube_namespace, "actuator-a", timing) as a,
        elector(kube, kube_namespace, "actuator-b", timing) as b,
    ):
        with Observer([a, b]) as observer:
            await seconds_until(lambda: a.is_leader or b.is_leader, timeout=5)
            await asyncio.sleep(timing.retry_period_s * 2)
            leader, standby = (a, b) if a.is_leader else (b, a)
            stopping = time.monotonic()
            await leader.stop()  # stops leading, then releases the Lease
            released = time.monotonic()
            assert not leader.is_leader
            await seconds_until(lambda: standby.is_leader, timeout=timing.retry_period_s + 5)
            takeover = time.monotonic() - stopping

        assert observer.overlaps == 0
        spec = read_lease(kube_admin, kube_namespace)
        assert (spec.holder_identity, spec.lease_transitions) == (standby.identity, 1)
        print(
            f"\n[{timing.lease_duration_s} s lease] takeover after a release: {takeover:.3f} s "
            f"(release written in {released - stopping:.3f} s)"
        )
        assert takeover <= timing.retry_period_s + SLACK_S


async def test_a_leader_that_cannot_renew_stops_before_the_standby_starts(
    kube: ControlPlane, kube_namespace: str
) -> None:
    timing = FAST
    with kube.admin_client() as api_a, kube.admin_client() as api_b:
        cut = SeverableLeaseStore(KubernetesLeaseStore(api_a, kube_namespace))
        a = LeaderElector(cut, "actuator-a", timing)
        b = LeaderElector(KubernetesLeaseStore(api_b, kube_namespace), "actuator-b", timing)
        await a.start()
        await seconds_until(lambda: a.is_leader, timeout=5)
        await b.start()
        with Observer([a, b]) as observer:
            await just_renewed(a, timeout=timing.renew_period_s + 2)
            cut.down = True
            since = time.monotonic()
            stepped_down = await seconds_until(lambda: not a.leading.is_set(), timeout=5)
            await seconds_until(lambda: b.is_leader, timeout=timing.lease_duration_s + 5)
            takeover = time.monotonic() - since
            cut.down = False  # back in touch: a sees b's Lease and stays a standby
            await asyncio.sleep(timing.retry_period_s * 3)
            assert b.is_leader
            assert not a.is_leader
        await a.stop(release=False)
        await b.stop()
    assert observer.overlaps == 0
    print(f"\ncut off: stepped down after {stepped_down:.3f} s, taken over after {takeover:.3f} s")
    assert stepped_down <= timing.renew_deadline_s
    assert takeover <= timing.lease_duration_s + timing.retry_period_s
