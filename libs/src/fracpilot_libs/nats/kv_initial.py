"""When a KV watcher has delivered every value its bucket held when the watch began.

nats-py marks that end with a ``None`` update. It puts the marker at once when the consumer's
info says nothing is pending and its subscription has handled nothing yet; but the server may
have sent every value already, still queued in the client, unhandled (a busy process): the
marker then comes before them, and a reader that stops at it reads the bucket empty (seen in
CI: ``fracpilot policy list`` printed no policy; 1 read in 300 with both cores busy). Each entry
says how many messages were still pending after it (``delta``), so the one with 0 is the last
value present at the start. A marker before any entry is taken as the end only when the server
delivered nothing to the watcher: the bucket was empty.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class InitialValues:
    """Follows one watcher's updates until its initial values are all in."""

    def __init__(self, watcher: Any) -> None:
        self._watcher = watcher
        self._entries = 0
        self.done = False

    async def saw(self, entry: Any) -> bool:
        """Note an update (an entry, or nats-py's ``None``); True once every value present at
        the start has come (this one included)."""
        if not self.done:
            if entry is not None:
                self._entries += 1
                self.done = not entry.delta  # nothing pending after it
            else:
                self.done = self._entries > 0 or not await self._delivered_any()
        return self.done

    async def _delivered_any(self) -> bool:
        try:
            info = await self._watcher._sub.consumer_info()  # nats-py's own check, asked again
        except Exception as exc:  # as nats-py would have it: the marker is the end
            log.warning("KV watch: consumer info unread", extra={"error": str(exc)[:300]})
            return False
        return bool(info.delivered.consumer_seq)
