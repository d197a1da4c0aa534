"""Awaiting with a deadline without losing a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the inner future completes in
the same loop pass as the awaiting task is cancelled: the cancellation is swallowed and a loop
that should stop goes on (a stopping actuator's reconcile loop ran on until the test gave up
after 30 s). ``asyncio.timeout`` counts cancellations and re-raises them, so every deadline in
the services goes through here; ``tests/unit/test_deadlines.py`` keeps ``asyncio.wait_for`` out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """``awaitable``'s result; ``TimeoutError`` after ``timeout_s`` (``None``: no deadline)."""
    async with asyncio.timeout(timeout_s):
        return await awaitable


async def event_set(event: asyncio.Event, timeout_s: float | None) -> bool:
    """True once ``event`` is set; False when ``timeout_s`` passes first."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


def cancel_requested() -> bool:
    """Whether the running task was asked to cancel, though the ``CancelledError`` may never
    have come: a library's ``asyncio.wait_for`` (nats-py awaits every reply through one)
    swallows it with the reply, but ``Task.cancelling()`` still counts the request. A loop
    that only a cancel ends checks this after each awaited round; a loop with a stop flag of
    its own checks that."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
