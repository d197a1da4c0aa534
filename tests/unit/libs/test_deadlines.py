"""A deadline never swallows a cancellation, and the services await deadlines only through
:mod:`fracpilot_libs.deadlines` (Python 3.11's ``asyncio.wait_for`` loses a cancellation that
arrives in the same loop pass as the inner result; see that module)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from fracpilot_libs.deadlines import cancel_requested, event_set, within

ROOT = Path(__file__).resolve().parents[3]
SOURCES = [ROOT / "libs" / "src", *sorted((ROOT / "services").glob("*/src")), ROOT / "src"]


async def _cancelled_as_it_completes(make_waiter: object) -> str:
    """Run ``make_waiter(release)`` as a task; complete its awaited thing and cancel the task in
    the same loop pass; say what the task did."""
    loop = asyncio.get_running_loop()
    release: asyncio.Future[None] = loop.create_future()
    event = asyncio.Event()

    async def waiting() -> str:
        await make_waiter(release, event)  # type: ignore[operator]
        return "went on"

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0.01)
    release.set_result(None)
    event.set()
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


async def test_asyncio_wait_for_loses_the_cancellation_here() -> None:
    # The bug this module exists for; if a Python fixes it, this test says so (and the module
    # may go).
    outcome = await _cancelled_as_it_completes(lambda fut, _e: asyncio.wait_for(fut, 5))
    assert outcome == "went on"


@pytest.mark.parametrize(
    "waiter",
    [
        pytest.param(lambda fut, _e: within(fut, 5), id="within"),
        pytest.param(lambda _f, event: event_set(event, 5), id="event_set"),
    ],
)
async def test_a_cancellation_as_the_wait_completes_is_kept(waiter: object) -> None:
    assert await _cancelled_as_it_completes(waiter) == "cancelled"


async def test_a_cancellation_lost_in_wait_for_is_still_requested() -> None:
    seen: list[bool] = []

    async def loses_the_cancel(fut: asyncio.Future[None], _e: asyncio.Event) -> None:
        seen.append(cancel_requested())
        await asyncio.wait_for(fut, 5)
        seen.append(cancel_requested())

    assert await _cancelled_as_it_completes(loses_the_cancel) == "went on"
    assert seen == [False, True]


async def test_deadlines_time_out_and_return() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await within(loop.create_future(), 0.01)
    assert await within(asyncio.sleep(0, result=7), 1) == 7
    event = asyncio.Event()
    assert await event_set(event, 0.01) is False
    event.set()
    assert await event_set(event, 0.01) is True


def test_no_service_awaits_through_asyncio_wait_for() -> None:
    found = []
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "wait_for"
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "asyncio"
                ) or (
                    isinstance(node, ast.ImportFrom)
                    and node.module == "asyncio"
                    and any(a.name == "wait_for" for a in node.names)
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], f"use fracpilot_libs.deadlines instead of asyncio.wait_for: {found}"
