"""Chaos suite fixtures: the figures of every scenario, printed at the end of the run.

Each scenario appends its :class:`~chaos.faults.ScenarioFigures` to ``chaos_figures``; the
terminal summary prints one table (faults injected, samples, decisions, losses, duplicates,
budget, floor, recovery times) and writes the same as JSON to
``.pytest_cache/chaos-figures.json`` (git-ignored), whatever the tests' outcome.
The Kubernetes scenarios get their own etcd + kube-apiserver (``chaos_kube``), as the
integration tests do, since fixtures do not cross test directories.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.faults import ScenarioFigures
from k8s_control_plane import ControlPlane, ControlPlaneError, ensure_testbin

_FIGURES = pytest.StashKey[list[ScenarioFigures]]()


@pytest.fixture(scope="session")
def chaos_figures(request: pytest.FixtureRequest) -> list[ScenarioFigures]:
    return request.config.stash.setdefault(_FIGURES, [])


@pytest.fixture(scope="session")
def chaos_kube() -> Iterator[ControlPlane]:
    try:
        bin_dir = ensure_testbin()
    except ControlPlaneError as exc:
        pytest.fail(f"no Kubernetes test binaries: {exc}", pytrace=False)
    with ControlPlane(bin_dir) as control_plane:
        yield control_plane


def _seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.2f} s"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures = terminalreporter.config.stash.get(_FIGURES, [])
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
