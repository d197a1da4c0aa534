"""The one pull-consumer feed: pull requests on core NATS, messages in batches.

The decision service's partitions, :meth:`fracpilot_libs.nats.bus.Bus.consume` and the snapshot
reads of :mod:`fracpilot_libs.nats.kv_snapshot` all take their messages through :class:`PullFeed`.

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

On a cluster a pull request can end without messages while the consumer's leader moves (409
"Leadership Change") or while none is elected yet (503, no responders: what a deleted consumer
answers too). After a 503 the feed asks the consumer's info: only a "not found" means the
consumer is gone; anything else (no answer, no leader yet) and the feed asks again.
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

from fracpilot_libs.deadlines import cancel_requested
from fracpilot_libs.nats.errors import PermanentNatsError

log = logging.getLogger(__name__)

_ENDS_REQUEST = {"404", "408", "409"}  # no messages, request expired, request refused
_BULK_TIMEOUT_S = 5.0  # a no_wait request is answered at once; longer means it was lost
_NO_CONSUMER = "503"  # no responders: the consumer (or its stream) is gone, or leaderless
_INFO_TIMEOUT_S = 2.0
_LEADERLESS_PAUSE_S = 0.25  # between requests while the consumer has no leader


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
        self._info_subject = f"$JS.API.CONSUMER.INFO.{stream}.{consumer}"
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
        self._unanswered = False  # a 503: gone, or between leaders (asked before trusting it)
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
            self._open, self._unanswered = False, True
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

    async def _consumer_exists(self) -> bool:
        """False only when JetStream answers that the consumer (or its stream) is not found;
        no answer or a server error (no leader elected yet) may be a leader moving."""
        try:
            reply = await self.nc.request(self._info_subject, b"", timeout=_INFO_TIMEOUT_S)
        except Exception:  # no responders, a timeout: the API or the leader is not there yet
            return True
        try:
            error = json.loads(reply.data).get("error") or {}
        except (ValueError, AttributeError):
            return True
        return not (isinstance(error, dict) and error.get("code") == 404)

    async def _check_unanswered(self) -> None:
        if not self._unanswered:
            return
        self._unanswered = False
        if await self._consumer_exists():
            log.info(
                "pull request unanswered, the consumer exists: asking again",
                extra={"consumer": self._next_subject},
            )
            await asyncio.sleep(_LEADERLESS_PAUSE_S)
        else:
            self._gone = True

    async def next_batch(self) -> list[Msg]:
        """The messages waiting now, at least one (waits for the first). Raises
        :class:`ConsumerGoneError` once the server says the consumer does not exist."""
        if not self._busy:
            while not self._buffer:
                await self._check_unanswered()
                if cancel_requested():  # the consumer's info came with a cancel and kept it
                    raise asyncio.CancelledError
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
        if not msgs:
            await self._check_unanswered()
        if self._gone and not msgs:
            raise ConsumerGoneError(self._next_subject)
        return msgs
