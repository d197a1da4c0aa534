"""A NATS KV bucket whose next put waits for a reply the test gives, as nats-py waits for one.

nats-py 2.16.0 awaits every KV reply through ``asyncio.wait_for`` (nats/aio/client.py,
``_request_new_style``), which on Python 3.11 returns the reply when a cancel comes in the same
loop pass (fracpilot_libs.deadlines). A test holds one put here, gives its reply and stops the
loop in that same pass: the lost cancel, on demand. The real server stores every put.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from nats.js.kv import KeyValue


class HeldKvPut:
    """The bucket's next put waits for :attr:`reply`; the puts after it go through at once. All
    are counted (:attr:`writes`); ``at_each`` is called with that count as each put begins."""

    def __init__(
        self,
        kv: KeyValue,
        monkeypatch: pytest.MonkeyPatch,
        at_each: Callable[[int], None] = lambda _: None,
    ) -> None:
        self.put = kv.put
        self.at_each = at_each
        self.reply: asyncio.Future[None] | None = None
        self.writes = 0
        monkeypatch.setattr(kv, "put", self._put)

    async def _put(self, key: str, value: bytes) -> int:
        self.writes += 1
        self.at_each(self.writes)
        if self.reply is None:
            self.reply = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(self.reply, 60)  # as nats-py's request
        return int(await self.put(key, value))
