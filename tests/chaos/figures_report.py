"""The chaos figures table: every scenario's faults, losses and recovery times, at the end.

Printed by ``pytest_terminal_summary`` in tests/conftest.py and written as JSON to
``.pytest_cache/chaos-figures.json`` (git-ignored), whatever the tests' outcome. Under
pytest-xdist the scenarios run in a worker: each worker hands its figures to the controller
through ``workeroutput`` (pickled: they are dataclasses of this test tree) and the controller
prints one table.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import pytest

from chaos.faults import ScenarioFigures

FIGURES = pytest.StashKey[list[ScenarioFigures]]()
_WORKER_KEY = "chaos_figures"


def hand_to_controller(config: pytest.Config) -> None:
    """In an xdist worker: put this worker's figures where the controller receives them."""
    workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
    figures = config.stash.get(FIGURES, [])
    if workeroutput is not None and figures:
        workeroutput[_WORKER_KEY] = pickle.dumps(figures)


def take_from_worker(config: pytest.Config, workeroutput: dict[str, Any]) -> None:
    """In the xdist controller: add a finished worker's figures to the table."""
    if raw := workeroutput.get(_WORKER_KEY):
        config.stash.setdefault(FIGURES, []).extend(pickle.loads(raw))


def _seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.2f} s"


def write_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures = terminalreporter.config.stash.get(FIGURES, [])
    if not figures:
        return
    write = terminalreporter.write_line
    terminalreporter.section("chaos figures")
    for fig in figures:
        f = fig.findings
        write(f"{fig.scenario}  ({fig.load}; {fig.wall_s:.0f} s)")
        write(f"  faults injected: {fig.faults_injected}  {dict(sorted(fig.injected.items()))}")
        if f is not None:
            expected = f" of {f.expected_samples} expected" if f.expected_samples else ""
            write(
                f"  samples {f.samples}{expected}: lost {f.lost_samples}, duplicated "
                f"{f.duplicate_samples}, unacknowledged {f.unacked_samples}, dead-lettered "
                f"{f.samples_dead_lettered}"
            )
            write(
                f"  decisions {f.decisions}, results {f.results}, applied {f.applied}: lost "
                f"{f.lost_decisions}, half-recorded {f.half_recorded}, applied twice "
                f"{f.duplicates}"
            )
            if f.evictions_accepted or f.disruptive_actions:
                write(
                    f"  evictions accepted {f.evictions_accepted} in {f.disruptive_actions} "
                    f"disruptive actions; most in one window {f.max_in_window} (one namespace "
                    f"{f.max_in_namespace_window}); budget breaches {f.budget_breaches}"
                )
            write(
                f"  below the memory floor {f.floor_breaches}; samples with a stale allocation "
                f"{f.stale_allocation_samples}; breaches in all {f.breaches}"
            )
        for run in fig.faults:
            noticed = "" if run.noticed is None else f", readiness dropped: {run.noticed}"
            write(
                f"  - {run.kind} {run.target} for {run.duration_s:.1f} s: ready again after "
                f"{_seconds(run.recovery_s)}{noticed}"
            )
        if fig.faults:
            write(f"  slowest recovery {_seconds(fig.max_recovery_s)}")
        for key, value in fig.extra.items():
            write(f"  {key}: {value}")
    path = Path(terminalreporter.config.rootpath) / ".pytest_cache" / "chaos-figures.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = [fig.as_json() for fig in figures]
    path.write_text(json.dumps(body, indent=2, default=str))
    write(f"chaos figures written to {path}")
