"""The one pull-consumer feed: pull requests on core NATS, messages in batches.

The decision service's partitions, :meth:`fracpilot_libs.bus.Bus.consume` and the snapshot
reads of :mod:`fracpilot_libs.kv_snapshot` all take their messages through :class:`PullFeed`.

nats-py's ``fetch`` awaits every message through ``asyncio.wait_for`` (a task per message)
and returns as soon as one has come, so at 100,000 workloads spread over 16 partitions most
fetches carried one sample and the fetching cost more than deciding. Here messages land in a
buffer from one subscription's callback, and the requests are shaped so that the server sends
them in bulk rather than one by one as they are stored:

- **idle**: a long-poll request for a single message (``batch=1``, ``expires``): the first
  sample to arrive ends it at once;
- **then**, after a short linger, a ``no_wait`` request for up to ``batch``: the server sends
  what is waiting in one go and ends the request; while such requests keep bringing messages
  (busy), the next one follows the same way.

An idle partition costs one request a second, a busy one a request per batch, and no request
stays open for messages to trickle through one at a time (which cost nats-server as much CPU
as storing them). Messages come in stream order; acknowledging them is the caller's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from fracpilot_libs.nats_errors import PermanentNatsError

log = logging.getLogger(__name__)

_ENDS_REQUEST = {"404", "408", "409"}  # no messages, request expired, request refused
_BULK_TIMEOUT_S = 5.0  # a no_wait request is answered at once; longer means it was lost
_NO_CONSUMER = "503"  # no responders: the consumer (or its stream) is gone


class ConsumerGoneError(PermanentNatsError):
    """The durable consumer no longer exists (deleted, or its stream deleted)."""


class PullFeed:
    """Batches of messages from a durable pull consumer, one request outstanding at a time."""

    def __init__(
        self,
        nc: NatsClient,
        stream: str,
        consumer: str,
        *,
        batch: int = 500,
        expires_s: float = 1.0,
        linger_s: float = 0.02,
    ) -> None:
        self.nc = nc
        self.batch = batch
        self.expires_s = expires_s
        self.linger_s = linger_s
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._buffer: list[Msg] = []
        self._signal = asyncio.Event()  # a message or the end of a request came
        self._open = False  # a request is outstanding
        self._wanted = 0  # messages the outstanding request asked for
        self._got = 0  # ... and those it brought so far
        self._busy = False  # the last bulk request brought messages
        self._full = False  # ... as many as it asked for: more are waiting, no linger
        self._refused = False
        self._gone = False

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_message)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_message(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is None:
            self._buffer.append(msg)
            self._got += 1
            if self._got >= self._wanted:
                self._open = False
        elif status == _NO_CONSUMER:
            self._open, self._gone = False, True
        elif status in _ENDS_REQUEST:
            self._open = False
            if status == "409":
                self._refused = True
                why = (msg.headers or {}).get("Description")
                log.warning(
                    "pull request refused", extra={"consumer": self._next_subject, "why": why}
                )
        else:
            return  # 100: an idle heartbeat
        self._signal.set()

    async def _request(self, wanted: int, *, wait: bool) -> None:
        body: dict[str, object] = {"batch": wanted}
        if wait:
            body["expires"] = int(self.expires_s * 1e9)
        else:
            body["no_wait"] = True
        self._wanted, self._got, self._open = wanted, 0, True
        await self.nc.publish(self._next_subject, json.dumps(body).encode(), reply=self._inbox)

    async def _until(self, done: Callable[[], bool], timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not done():
                    self._signal.clear()
                    await self._signal.wait()
        self._open = False  # over, or lost (a reconnect): either way ask anew

    async def next_batch(self) -> list[Msg]:
        """The messages waiting now, at least one (waits for the first). Raises
        :class:`ConsumerGoneError` once the server says the consumer does not exist."""
        if not self._busy:
            while not self._buffer:
                if self._gone:
                    raise ConsumerGoneError(self._next_subject)
                if self._refused:
                    self._refused = False
                    await asyncio.sleep(0.5)
                await self._request(1, wait=True)
                await self._until(lambda: not self._open, self.expires_s + 2.0)
        if self.linger_s and not self._full:
            await asyncio.sleep(self.linger_s)  # let a few more be stored: a bigger batch
        await self._request(self.batch, wait=False)
        await self._until(lambda: not self._open, _BULK_TIMEOUT_S)
        self._busy, self._full = self._got > 0, self._got >= self.batch
        msgs, self._buffer = self._buffer, []
        if self._gone and not msgs:
            raise ConsumerGoneError(self._next_subject)
        return msgs
