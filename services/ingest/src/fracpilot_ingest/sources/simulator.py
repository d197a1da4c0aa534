"""The ``simulator`` source: the demo's simulated workloads (:mod:`fracpilot_libs.simulation`),
one sample per workload per simulated step, paced by the simulated clock.

Each sample names the pod, node, GPU and fraction the actuator recorded for its workload, when
it has placed it. The source ends after ``FRACPILOT_SIM_DURATION_S`` of simulated time (0:
never).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from fracpilot_ingest.settings import SimulatorSettings
from fracpilot_ingest.sources.base import Reading, SourceContext
from fracpilot_libs.contracts import Allocation, Attribution, UsageSample
from fracpilot_libs.simulation.workloads import (
    SimulatedWorkload,
    demo_workloads,
    signals_at,
    usage_at,
)

log = logging.getLogger(__name__)


def simulated_sample(
    w: SimulatedWorkload, at: datetime, allocation: Allocation | None
) -> UsageSample:
    """The workload's sample at simulated time ``at``, where ``allocation`` puts it (pure)."""
    compute, memory = usage_at(w, at, allocation.fraction if allocation else None)
    return UsageSample(
        sample_id=f"sim|{w.workload.key}|{int(at.timestamp())}",
        workload=w.workload,
        pod=allocation.pod if allocation else w.pod,
        node=allocation.node if allocation else "",
        gpu_uuid=allocation.gpu_uuid if allocation else "",
        gpu_model=w.gpu_model,
        timestamp=at,
        compute=compute,
        memory_used_bytes=memory,
        memory_total_bytes=w.device_memory_bytes,
        allocated_fraction=allocation.fraction if allocation else None,
        source="simulator",
        attribution=Attribution.EXACT,
        signals=signals_at(w, at, allocation.fraction if allocation else None),
    )


class SimulatorSource:
    name = "simulator"

    def __init__(self, settings: SimulatorSettings, context: SourceContext) -> None:
        self.settings = settings
        self.context = context
        self.workloads = demo_workloads(settings.namespace, settings.cluster)[: settings.workloads]
        self.at = settings.start
        self.steps = 0
        self._started = 0.0

    async def open(self) -> None:
        self._started = asyncio.get_running_loop().time()
        self.at = self.settings.start
        self.steps = 0

    async def read(self) -> Reading | None:
        s = self.settings
        if s.duration_s != 0 and self.at >= s.start + timedelta(seconds=s.duration_s):
            log.info(
                "simulation finished", extra={"steps": self.steps, "sim_end": self.at.isoformat()}
            )
            return None
        allocations = self.context.allocations
        samples = [
            simulated_sample(w, self.at, allocations.get(w.workload.key)) for w in self.workloads
        ]
        return Reading(s.step_s, samples=samples)

    async def published(self, reading: Reading) -> None:
        self.context.metrics.sim_time.set(self.at.timestamp())
        self.steps += 1
        self.at += timedelta(seconds=self.settings.step_s)

    def next_read_in(self) -> float:
        # Paced by the simulated clock, not by sleeps, so slow publishes do not drift.
        s = self.settings
        loop_now = asyncio.get_running_loop().time()
        return self._started + self.steps * s.step_s / s.speed - loop_now
