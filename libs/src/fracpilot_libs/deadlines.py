"""Awaiting with a deadline without losing a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the inner future completes in
the same loop pass as the awaiting task is cancelled: the cancellation is swallowed and a loop
that should stop goes on (a stopping actuator's reconcile loop ran on until the test gave up
after 30 s). ``asyncio.timeout`` counts cancellations and re-raises them, so every deadline in
the services goes through here; ``tests/unit/test_deadlines.py`` keeps ``asyncio.wait_for`` out.

A stop that cancels a background task and awaits it under ``suppress(CancelledError)`` swallows
a cancel aimed at the stopping task too; :func:`cancel_and_wait` tells the two apart by the same
count ``asyncio.timeout`` uses.
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


async def cancel_and_wait(task: asyncio.Future[T] | None) -> None:
    """Cancel ``task`` and return once it has ended (``None``, or a task already ended: at once).

    The task's own ``CancelledError`` is swallowed; an exception it raised propagates. A cancel
    of the calling task that arrives while it waits is re-raised once the task has ended (it
    was passed on to the task meanwhile, as a plain ``await`` does). A caller already being
    cancelled when it calls (a stop in a ``finally:`` of a cancelled task) gets no
    ``CancelledError`` for that old cancel and goes on with its cleanup: only the count of
    cancels growing during the wait says one was aimed at the caller, as in
    ``asyncio.timeout``.
    """
    if task is None:
        return
    caller = asyncio.current_task()
    cancels_before = caller.cancelling() if caller is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass  # the task's own, unless the count below says the caller's
    finally:
        # Also when the task swallowed the cancel passed on to it and returned: the caller's
        # cancel is still counted, and still owed to it.
        if caller is not None and caller.cancelling() > cancels_before:
            raise asyncio.CancelledError
