"""When a labelled series has gone stale: the last time each label set was seen (pure).

A service that exports per-workload series (labels such as ``namespace``, ``workload``) would
otherwise keep exporting a workload's last value forever after the workload is gone: a
gauge frozen at its last value, and series that only grow in number. The owner of the metrics
:meth:`LastSeen.touch`\\ es a label set whenever it sets its series and asks
:meth:`LastSeen.expire` now and then for the label sets not seen for the TTL, then removes
their series (``metric.remove(*labels)``). Time is an argument; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Hashable, KeysView
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class LastSeen(Generic[K]):
    """The last time each key (a label set) was seen; keys unseen for ``ttl_s`` expire."""

    def __init__(self, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._seen: dict[K, float] = {}

    def touch(self, key: K, now: float) -> None:
        """``key`` was seen at ``now`` (a time earlier than one already noted is ignored)."""
        self._seen[key] = max(now, self._seen.get(key, now))

    def forget(self, key: K) -> bool:
        """Stop tracking ``key`` (it was deleted); False if it was not tracked."""
        return self._seen.pop(key, None) is not None

    def expire(self, now: float) -> list[K]:
        """The keys last seen more than ``ttl_s`` before ``now``, no longer tracked."""
        cutoff = now - self.ttl_s
        gone = [key for key, seen in self._seen.items() if seen < cutoff]
        for key in gone:
            del self._seen[key]
        return gone

    def last_seen(self, key: K) -> float | None:
        return self._seen.get(key)

    def keys(self) -> KeysView[K]:
        """The keys tracked, a live view (membership in C: a caller's loop per sample)."""
        return self._seen.keys()

    def __contains__(self, key: object) -> bool:
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)
