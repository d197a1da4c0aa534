"""The NATS servers as a client account sees them: how many there are, and whether a majority
of them answer (without which JetStream has no meta leader).

Every account can ask ``$SYS.REQ.SERVER.PING.CONNZ`` (nats-server imports it into each account,
scoped to that account's connections) and every server of the cluster answers it: the count of
answers within a short wait is the number of servers that are up and reachable. Servers cut
off (killed, frozen, partitioned) do not answer at once, while a JetStream leader that has lost
its quorum goes on answering stream info requests for a while (seen: over 16 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

SERVER_PING = "$SYS.REQ.SERVER.PING.CONNZ"
CLUSTER_REPLICAS = 3


def replicas_for(
    setting: int | None, server_info: Mapping[str, object], servers: int | None = None
) -> int:
    """The replicas of streams and buckets: the setting, else 1 on a single server and on a
    cluster of fewer than three servers (an R3 stream could not be placed on two; R2 would
    stop with either down), else 3. ``servers``: the cluster's size when it is known, else
    the client URLs the server advertises (INFO ``connect_urls``), else 3 is assumed."""
    if setting is not None:
        return setting
    if not server_info.get("cluster"):
        return 1
    if servers is None:
        urls = server_info.get("connect_urls")
        servers = len(set(urls)) if isinstance(urls, list) and urls else CLUSTER_REPLICAS
    return CLUSTER_REPLICAS if servers >= CLUSTER_REPLICAS else 1


def has_quorum(answering: int, cluster_size: int) -> bool:
    """A majority of the cluster's servers answer (what its JetStream meta group needs)."""
    return answering >= cluster_size // 2 + 1


def servers_in(replies: list[bytes]) -> int:
    """Distinct servers among the ping's replies."""
    ids: set[str] = set()
    for data in replies:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            server = json.loads(data).get("server") or {}
            ids.add(str(server.get("id") or server.get("name")))
    return len(ids)


async def servers_answering(nc: NatsClient, wait_s: float = 0.5) -> int | None:
    """How many servers answer the account's server ping within ``wait_s``; None when none
    does (the identity may not publish the ping, or the server has no system account)."""
    replies: list[bytes] = []

    async def collect(msg: Msg) -> None:
        replies.append(msg.data)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=collect)
    try:
        # limit 1: the count of answers is what matters, not the connection lists
        await nc.publish(SERVER_PING, b'{"limit":1}', reply=inbox)
        await asyncio.sleep(wait_s)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return servers_in(replies) or None
