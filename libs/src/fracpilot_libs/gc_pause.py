"""The cyclic garbage collector paused over a burst of allocations that make no cycles.

Turning a Prometheus response of 100,000 GPUs into samples allocates millions of small
objects (points, observations, samples, their JSON) that live until the batch is published.
CPython starts a collection every 700 net allocations, and its older generations traverse
every object alive: about a third of the ingest cycle's CPU went to collections that found
nothing to free (20,000 GPUs from JSON to encoded batches: 1.9 s, 1.25 s with the collector
off; docs/performance.md). Reference counting still frees everything that is not a cycle
while paused; the collector runs again (and takes any cycle made meanwhile) when the last
pause ends. Pauses nest and may overlap across threads (a worker thread parsing a response
while the event loop publishes).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside (unless something else turns it on)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
