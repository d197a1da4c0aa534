"""Chaos suite fixtures: the figures of every scenario, printed at the end of the run.

Each scenario appends its :class:`~chaos.faults.ScenarioFigures` to ``chaos_figures``;
chaos/figures_report.py prints them (the hook is in tests/conftest.py, which the xdist
controller loads, so the table survives ``-n``). The Kubernetes scenarios get their own
etcd + kube-apiserver (``chaos_kube``), as the integration tests do, since fixtures do not
cross test directories.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos.faults import ScenarioFigures
from chaos.figures_report import FIGURES
from k8s_control_plane import ControlPlane, ControlPlaneError, ensure_testbin


@pytest.fixture(scope="session")
def chaos_figures(request: pytest.FixtureRequest) -> list[ScenarioFigures]:
    return request.config.stash.setdefault(FIGURES, [])


@pytest.fixture(scope="session")
def chaos_kube() -> Iterator[ControlPlane]:
    try:
        bin_dir = ensure_testbin()
    except ControlPlaneError as exc:
        pytest.fail(f"no Kubernetes test binaries: {exc}", pytrace=False)
    with ControlPlane(bin_dir) as control_plane:
        yield control_plane
