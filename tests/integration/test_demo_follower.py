"""The demo's stream follower counts every sample ingest published, in either usage format
(one sample per message, or batches of an instant's samples), on a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from fracpilot_cli.demo import StreamFollower
from fracpilot_cli.summary import RunSummary
from helpers import reset_nats
from support.operator_scenario import namespace_policy, operator_fleet, publish, record

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("wire", ["sample", "batch"])
async def test_the_demo_summary_counts_every_published_sample(nats_url: str, wire: str) -> None:
    await reset_nats(nats_url)
    rec = record(operator_fleet(), namespace_policy("inference", 1))
    await publish(nats_url, rec, wire=wire, batch_samples=3)
    summary = RunSummary(step_s=60.0)
    follower = StreamFollower(summary)
    await follower.start(nats_url)
    try:
        for _ in range(100):
            if summary.samples >= len(rec.samples):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # and no more than that
        assert summary.samples == len(rec.samples)
        assert set(summary.workloads) == {s.workload.key for s in rec.samples}
        for key, view in summary.workloads.items():
            assert view.samples == sum(1 for s in rec.samples if s.workload.key == key)
    finally:
        await follower.close()
