"""A deadline never swallows a cancellation, and the services await deadlines only through
:mod:`fracpilot_libs.deadlines` (Python 3.11's ``asyncio.wait_for`` loses a cancellation that
arrives in the same loop pass as the inner result; see that module). A stop that cancels a
background task and waits for it keeps a cancel aimed at the stopping task
(``cancel_and_wait``), and no service swallows one under ``suppress(CancelledError)`` (nor
``suppress(BaseException)``)."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from fracpilot_libs.deadlines import cancel_and_wait, cancel_requested, event_set, within

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


def _places(matches: Callable[[ast.AST], bool]) -> list[str]:
    """``path:line`` of each node of the sources that ``matches``."""
    found = []
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if matches(node):
                    found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}")
    return found


def _is_wait_for(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "wait_for"
        and isinstance(node.value, ast.Name)
        and node.value.id == "asyncio"
    ) or (
        isinstance(node, ast.ImportFrom)
        and node.module == "asyncio"
        and any(a.name == "wait_for" for a in node.names)
    )


def test_no_service_awaits_through_asyncio_wait_for() -> None:
    found = _places(_is_wait_for)
    assert found == [], f"use fracpilot_libs.deadlines instead of asyncio.wait_for: {found}"


async def _outlives_its_first_cancel(ended: list[str], *, keeps_the_second: bool) -> None:
    """A background task whose clean-up takes a while after its cancel (a shielded sleep); a
    second cancel meanwhile ends it (``keeps_the_second``) or is swallowed and it returns."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        try:
            await asyncio.shield(asyncio.sleep(0.05))
        except asyncio.CancelledError:
            ended.append("second cancel")
            if keeps_the_second:
                raise
            return
        ended.append("cleaned up")
        raise


async def test_cancel_and_wait_cancels_the_task_and_waits_for_its_end() -> None:
    ended: list[str] = []
    task = asyncio.create_task(_outlives_its_first_cancel(ended, keeps_the_second=True))
    await asyncio.sleep(0.01)
    await cancel_and_wait(task)  # the task's CancelledError stays in it
    assert task.cancelled()
    assert ended == ["cleaned up"]


@pytest.mark.parametrize("keeps_the_second", [True, False], ids=["task-ends", "task-swallows"])
async def test_a_cancel_of_the_caller_while_it_waits_is_raised(keeps_the_second: bool) -> None:
    # The suppress(CancelledError) this replaces let the stopping task go on as if never
    # cancelled; a plain await let it go on when the task swallowed the cancel passed on.
    ended: list[str] = []
    went_on: list[str] = []
    task = asyncio.create_task(_outlives_its_first_cancel(ended, keeps_the_second=keeps_the_second))
    await asyncio.sleep(0.01)

    async def stop() -> None:
        await cancel_and_wait(task)
        went_on.append("after the stop")

    stopping = asyncio.create_task(stop())
    await asyncio.sleep(0.01)  # the task is in its clean-up now
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert went_on == []
    assert task.done()  # waited for all the same
    assert ended == ["second cancel"]


async def test_a_caller_already_cancelled_goes_on_with_its_cleanup() -> None:
    # A stop in the finally of a task being cancelled: its own cancel is not raised again there.
    ended: list[str] = []
    cleanup: list[str] = []
    task = asyncio.create_task(_outlives_its_first_cancel(ended, keeps_the_second=True))

    async def serve() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await cancel_and_wait(task)
            cleanup.append("after the stop")

    serving = asyncio.create_task(serve())
    await asyncio.sleep(0.01)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving  # its own cancel, from the sleep
    assert cleanup == ["after the stop"]
    assert task.cancelled()
    assert ended == ["cleaned up"]


async def test_cancel_and_wait_on_none_or_an_ended_task_returns() -> None:
    await cancel_and_wait(None)
    returned = asyncio.create_task(asyncio.sleep(0, result=1))
    cancelled = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    assert returned.done()
    assert cancelled.cancelled()
    await cancel_and_wait(returned)
    await cancel_and_wait(cancelled)
    assert returned.result() == 1


async def test_an_error_of_the_task_propagates() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("clean-up failed") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="clean-up failed"):
        await cancel_and_wait(task)


def _name(node: ast.expr) -> str | None:
    """``x`` of ``x`` or of ``module.x``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _suppresses_a_cancellation(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and _name(node.func) == "suppress"
        and any(_name(a) in {"CancelledError", "BaseException"} for a in node.args)
    )


def test_no_service_suppresses_a_cancellation() -> None:
    found = _places(_suppresses_a_cancellation)
    assert found == [], f"use fracpilot_libs.deadlines.cancel_and_wait: {found}"
