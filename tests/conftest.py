"""Shared fixtures: a real nats-server per test module (or FRACPILOT_NATS_URL if set)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fracpilot_libs.embedded_nats import EmbeddedNats


@pytest.fixture(scope="module")
def nats_server() -> Iterator[EmbeddedNats | None]:
    """A fresh JetStream server for the module; None when FRACPILOT_NATS_URL names one."""
    if os.environ.get("FRACPILOT_NATS_URL"):
        yield None
        return
    server = EmbeddedNats().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def nats_url(nats_server: EmbeddedNats | None) -> str:
    return nats_server.url if nats_server else os.environ["FRACPILOT_NATS_URL"]
