"""An ingest replica SIGKILLed mid-cycle: no sample lost, none counted twice.

Two ingest processes (``FRACPILOT_INGEST_SHARDS=8``) share one real Prometheus scraping the
GPU test exporter, over a secured nats-server (deploy/nats's permissions, each process the
ingest identity). Replica b is SIGKILLed at a random moment, and the kill counts as mid-cycle
when the stream holds samples of b's shards past those shards' cursors (published, cursor not
yet moved); until one is, b is restarted (as a supervisor would) and killed again. Then b
stays dead: a takes its shards over once their leases run out, from their cursors. At the end
every GPU's sample of every instant, from the first stored to the last every shard's cursor
passed, is in the usage streams exactly once: the instants b published and a published again
had the same batch ids, and the stream's duplicate window dropped them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.faults import FaultRun, ScenarioFigures, seconds_until_ready
from chaos.invariants import Findings, kv_items, read_all
from fracpilot_cli.processes import ServiceProcess
from fracpilot_ingest.shard_plan import cursor_key, shard_of
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.usage_batch import as_samples
from fracpilot_libs.nats.usage_streams import usage_streams
from fracpilot_libs.server_process import free_port
from helpers import NatsAccess, connect
from support.dcgm_prometheus import dcgm_prometheus
from support.gpu_exporter import GpuState, PodOnGpu
from support.nats_auth import SecuredNats, chart_tls_files
from support.prometheus_server import PrometheusServer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

SHARDS = 8
LEASE_S = 2.0
STEP = 1.0
# Enough GPUs that a cycle (query, attribute, publish) takes a good part of the interval.
GPUS = [
    GpuState(
        f"GPU-c4a0-{i:05x}",  # the last hex digits spread them over the shards
        f"gpu-node-{i // 8}",
        "NVIDIA H100 80GB HBM3",
        81_920,
        util_pct=i % 90,
        pods=[PodOnGpu(f"team-{i % 7}", f"svc{i}-0", "server", i % 90, 1_000 + i)],
        index=i % 8,
    )
    for i in range(800)
]
MAX_KILLS = 8


@pytest.fixture
def prom() -> Iterator[PrometheusServer]:
    with dcgm_prometheus(GPUS, STEP) as server:
        yield server


async def stored_samples(access: NatsAccess) -> list[UsageSample]:
    nc = await connect(access)
    try:
        return [
            UsageSample.model_validate_json(line)
            for stream in await usage_streams(nc.jetstream())
            for m in await read_all(nc, stream)
            for _, line in as_samples(m.subject, m.data)
        ]
    finally:
        await nc.close()


async def leases_and_cursors(access: NatsAccess) -> tuple[dict[int, str], dict[int, float]]:
    """Who holds each shard's lease, and each shard's cursor."""
    nc = await connect(access)
    try:
        js = nc.jetstream()
        leases = await kv_items(js, subjects.INGEST_SHARD_BUCKET)
        state = await kv_items(js, subjects.INGEST_STATE_BUCKET)
    finally:
        await nc.close()
    holders = {
        int(k.removeprefix("partition.")): v.decode()
        for k, v in leases.items()
        if k.startswith("partition.")
    }
    cursors = {
        k: float(state[cursor_key(k, SHARDS)])
        for k in range(SHARDS)
        if cursor_key(k, SHARDS) in state
    }
    return holders, cursors


async def when_a_batch_of(access: NatsAccess, shards: set[int], timeout_s: float) -> bool:
    """Return as soon as a batch of one of ``shards`` lands in a usage stream (True), or
    after ``timeout_s`` (False). Its publisher is then mid-cycle: a shard's cursor moves only
    once every batch of the reading is acknowledged. Only new messages are read, one at a
    time (the operator identity's single-message reads); a batch holds one shard's samples."""
    nc = await connect(access)
    try:
        js = nc.jetstream()
        streams = await usage_streams(js)
        last = {st: (await js.stream_info(st)).state.last_seq for st in streams}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for st in streams:
                top = (await js.stream_info(st)).state.last_seq
                for seq in range(last[st] + 1, top + 1):
                    m = await js.get_msg(st, seq)
                    first = next(iter(as_samples(m.subject, m.data or b"")), None)
                    if first is not None:
                        gpu = UsageSample.model_validate_json(first[1]).gpu_uuid
                        if shard_of(gpu, SHARDS) in shards:
                            return True
                last[st] = top
            await asyncio.sleep(0.01)
        return False
    finally:
        await nc.close()


async def wait_until(check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.2)


async def test_an_ingest_replica_killed_mid_cycle_loses_no_sample_and_counts_none_twice(
    tmp_path: Path, prom: PrometheusServer, chaos_figures: list[ScenarioFigures]
) -> None:
    figures = ScenarioFigures(
        "ingest replica killed mid-cycle (2 replicas, 8 shards)",
        f"{len(GPUS)} GPUs on one Prometheus, an instant a second",
    )
    chaos_figures.append(figures)
    started = time.monotonic()
    server = SecuredNats(tmp_path / "nats", tls=chart_tls_files(tmp_path / "tls")).start()
    operator = server.settings("operator")
    ports = {"a": free_port(), "b": free_port()}

    def replica(name: str) -> ServiceProcess:
        env = {
            **server.env("ingest"),
            "FRACPILOT_SOURCES": "prometheus",
            "FRACPILOT_PROMETHEUS_URL": prom.url,
            "FRACPILOT_PROMETHEUS_MATCHERS": 'job="dcgm"',
            "FRACPILOT_PROMETHEUS_DELAY_S": str(2 * STEP),  # an instant is complete when read
            "FRACPILOT_MAPPING_FAMILIES": "dcgm,dcgm-process",
            "FRACPILOT_INTERVAL_S": str(STEP),
            "FRACPILOT_BACKFILL_S": "3",
            "FRACPILOT_CLUSTER": "test",
            "FRACPILOT_DEFAULT_DEVICE_MEMORY_GIB": "80",
            "FRACPILOT_USAGE_VIEW": "false",
            "FRACPILOT_INGEST_SHARDS": str(SHARDS),
            "FRACPILOT_INGEST_SHARD_LEASE_S": str(LEASE_S),
            "FRACPILOT_INGEST_REPLICA_ID": f"ingest-{name}",
            "FRACPILOT_METRICS_PORT": str(ports[name]),
        }
        (tmp_path / name).mkdir(exist_ok=True)
        return ServiceProcess("ingest", env, tmp_path / name)

    a, b = replica("a"), replica("b")

    async def balanced() -> bool:
        holders, _ = await leases_and_cursors(operator)
        return Counter(holders.values()) == {"ingest-a": SHARDS // 2, "ingest-b": SHARDS // 2}

    mid_cycle: dict[int, int] = {}  # b's shard -> its samples stored past its cursor
    kills = 0
    try:
        a.start().wait_for_log("service ready", timeout_s=60)
        b.start().wait_for_log("service ready", timeout_s=60)
        await wait_until(balanced, 30)
        while not mid_cycle and kills < MAX_KILLS:
            await asyncio.sleep(random.uniform(0.0, STEP))
            holders, _ = await leases_and_cursors(operator)
            mine = {k for k, holder in holders.items() if holder == "ingest-b"}
            # Killed as soon as one of b's batches lands (a quicker cycle than the test's
            # polling left no window to a random kill: CI, 8 kills of 8 between cycles).
            await when_a_batch_of(operator, mine, timeout_s=5 * STEP)
            b.kill()  # SIGKILL: no hand-over, no cursor written
            down = time.monotonic()
            kills += 1
            _, cursors = await leases_and_cursors(operator)
            for s in await stored_samples(operator):
                k = shard_of(s.gpu_uuid, SHARDS)
                if k in mine and s.timestamp.timestamp() > cursors.get(k, float("inf")):
                    mid_cycle[k] = mid_cycle.get(k, 0) + 1
            if not mid_cycle:  # between cycles: restart it, kill again
                b.start()
                recovery = await seconds_until_ready([ports["b"]])
                figures.fault(FaultRun("SIGKILL + restart", "ingest b", 0.0, recovery))
                await wait_until(balanced, 30)
        assert mid_cycle, f"no kill in {kills} landed mid-cycle"
        killed_at = time.time()

        # b stays dead: a takes its shards over once their leases run out.
        async def a_has_everything_past_the_kill() -> bool:
            holders, cursors = await leases_and_cursors(operator)
            return (
                set(holders.values()) == {"ingest-a"}
                and len(cursors) == SHARDS
                and min(cursors.values()) >= killed_at + 3 * STEP
            )

        await wait_until(a_has_everything_past_the_kill, 30)
        took_over = time.monotonic() - down
        figures.fault(FaultRun("SIGKILL mid-cycle, not restarted", "ingest b", took_over, 0.0))
        a.stop()  # SIGTERM: its shards handed back, cursors as they are
        _, cursors = await leases_and_cursors(operator)
        samples = await stored_samples(operator)
    finally:
        figures.wall_s = time.monotonic() - started
        for p in (a, b):
            p.kill()
        violations = server.violations("ingest")
        server.cleanup()

    # Every GPU at every instant from the first stored to the last every cursor passed.
    lo = min(s.timestamp.timestamp() for s in samples)
    hi = min(cursors.values())
    instants = [lo + i * STEP for i in range(int((hi - lo) / STEP) + 1)]
    expected = {(g.uuid, t) for g in GPUS for t in instants}
    seen = Counter((s.gpu_uuid, s.timestamp.timestamp()) for s in samples)
    ids = Counter(s.sample_id for s in samples)
    findings = Findings(
        samples=sum(n for key, n in seen.items() if key in expected),
        expected_samples=len(expected),
        lost_samples=len(expected - set(seen)),
        duplicate_samples=sum(n - 1 for n in ids.values() if n > 1),
    )
    figures.findings = findings
    figures.extra["kills until one landed mid-cycle"] = kills
    figures.extra["samples of the killed replica past its cursors"] = sum(mid_cycle.values())
    figures.extra["seconds until its shards were published again"] = round(took_over, 1)
    assert violations == [], "the ingest identity lacked a permission"
    assert findings.lost_samples == 0, findings
    assert findings.duplicate_samples == 0, findings
    assert findings.samples == findings.expected_samples
    assert len(instants) >= 8
