"""Fixtures shared by the integration tests of fracpilot's NATS doors (the KV adapter, its
snapshot and watch readers): a client of the test's nats-server and a KV bucket of its own."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import nats
import pytest

from fracpilot_libs.nats.client_types import NatsClient
from fracpilot_libs.nats.kv import KvBucket, open_kv


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
async def bucket(nc: NatsClient) -> AsyncIterator[KvBucket]:
    """A bucket of its own (made by open_kv: it does not exist yet), deleted afterwards."""
    name = f"test_kv_{uuid.uuid4().hex[:8]}"
    yield await open_kv(nc.jetstream(), name)
    await nc.jetstream().delete_key_value(name)
