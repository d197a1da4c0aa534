"""Injecting faults into processes and timing the recovery; the figures a chaos run reports."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.invariants import Findings

READY_WITHIN_S = 10.0


def readyz(port: int) -> bool:
    """Whether a service answers 200 on /readyz (a stopped or dead one does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=0.5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


async def seconds_until_ready(ports: Iterable[int], timeout_s: float = 30.0) -> float:
    """Poll every service's /readyz until all answer 200; seconds it took (inf: never)."""
    ports = list(ports)
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        answers = await asyncio.gather(*(asyncio.to_thread(readyz, p) for p in ports))
        if all(answers):
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    return float("inf")


async def went_unready(ports: Iterable[int], within_s: float = 3.0) -> bool:
    """Whether some service stops answering ready within the time (it noticed the fault)."""
    ports = list(ports)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        answers = await asyncio.gather(*(asyncio.to_thread(readyz, p) for p in ports))
        if not all(answers):
            return True
        await asyncio.sleep(0.05)
    return False


def pause(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def resume(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


@dataclass
class FaultRun:
    """One fault: what, for how long, and how long the services took to be ready after it."""

    kind: str
    target: str
    duration_s: float
    recovery_s: float
    noticed: bool | None = None  # readiness dropped during the fault (None: not looked at)


@dataclass
class ScenarioFigures:
    scenario: str
    load: str
    faults: list[FaultRun] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    findings: Findings | None = None
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def fault(self, run: FaultRun, *, count: bool = True) -> FaultRun:
        """Record a fault episode; ``count``: it is one fault (a kill), not a burst whose
        individual faults are counted where they are injected (the proxy's requests)."""
        self.faults.append(run)
        if count:
            self.injected[f"{run.kind} {run.target}"] += 1
        return run

    @property
    def faults_injected(self) -> int:
        return sum(self.injected.values())

    @property
    def max_recovery_s(self) -> float:
        return max((f.recovery_s for f in self.faults), default=0.0)

    def as_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["faults_injected"] = self.faults_injected
        body["max_recovery_s"] = self.max_recovery_s
        body["injected"] = dict(self.injected)
        return body
