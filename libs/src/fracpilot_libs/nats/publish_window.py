"""Publishing without waiting for each acknowledgement: a bounded window of them outstanding.

:meth:`PublishWindow.submit` hands a message to a task that publishes it (``send``: retried
with the same ``Nats-Msg-Id`` until acknowledged or given up,
:mod:`fracpilot_libs.nats.publish_retry`) and returns at once, unless ``size`` are already
outstanding: then it waits for one to be acknowledged (back-pressure: the caller reads no
faster than the server stores). Messages with the same ``key`` (a usage partition) are sent
one after the other, each once the one before it is acknowledged: a retried message can then
never be stored after a later one of its key, so each workload's samples stay in order.
A message whose predecessor of the same key failed is not sent. Messages of one key
submitted with the same ``round_id`` (the batches of one scrape instant: their samples have
the same timestamp, so their order among themselves does not matter) are sent together, each
once every message of its key from the rounds before is acknowledged: at R3 a sharded ingest
has 8-16 batches of a partition an instant, and one at a time they were as many raft rounds
in a row at the end of each cycle (docs/performance.md, "Ingest replicas").

:meth:`PublishWindow.drain` waits for every message submitted and raises the first failure:
the caller moves its cursor only after a drain that did not raise, so a failure means the
same messages are published again (with the same ids: stored once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable

Send = Callable[[str, bytes, str], Awaitable[bool]]  # True: stored, False: a duplicate
OnAcked = Callable[[bool], Awaitable[None]]  # awaited with ``stored`` once acknowledged


class PublishSkippedError(RuntimeError):
    """Not sent: an earlier message of its key failed."""


class PublishWindow:
    """At most ``size`` publishes outstanding; one per key at a time, in submission order."""

    def __init__(self, send: Send, size: int) -> None:
        if size < 1:
            raise ValueError("the window holds at least one publish")
        self._send = send
        self._slots = asyncio.Semaphore(size)
        # Per key: its last round's id, the round before's tasks (what it waits for), its tasks.
        self._last: dict[
            Hashable, tuple[Hashable, tuple[asyncio.Task[bool], ...], list[asyncio.Task[bool]]]
        ] = {}
        self._pending: set[asyncio.Task[bool]] = set()
        self._failure: BaseException | None = None
        self.size = size

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    async def submit(
        self,
        key: Hashable,
        subject: str,
        body: bytes,
        msg_id: str,
        on_acked: OnAcked,
        round_id: Hashable = None,
    ) -> None:
        """Queue one publish; waits while the window is full. Raises an earlier failure at
        once (no point reading further: the drain will raise it). ``round_id``: sent with
        the messages of its key just submitted with the same one (None: a round alone)."""
        if self._failure is not None:
            raise self._failure
        await self._slots.acquire()
        last = self._last.get(key)
        if last is not None and round_id is not None and last[0] == round_id:
            before, together = last[1], last[2]  # the round goes on: after the same ones
        else:
            before, together = (tuple(last[2]) if last else ()), []
            self._last[key] = (round_id, before, together)
        task = asyncio.create_task(self._publish(before, subject, body, msg_id, on_acked))
        together.append(task)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(
        self,
        before: tuple[asyncio.Task[bool], ...],
        subject: str,
        body: bytes,
        msg_id: str,
        on_acked: OnAcked,
    ) -> bool:
        try:
            if before and not all(await asyncio.gather(*map(asyncio.shield, before))):
                raise PublishSkippedError(f"{subject}: an earlier publish of its key failed")
            await on_acked(await self._send(subject, body, msg_id))
            return True
        except Exception as exc:  # kept for the drain; the task itself ends quietly
            if self._failure is None:
                self._failure = exc
            return False
        finally:
            self._slots.release()

    async def drain(self) -> None:
        """Wait for every publish submitted; raise the first failure (then forget it)."""
        while self._pending:
            await asyncio.wait(set(self._pending))
        self._last.clear()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    async def cancel(self) -> None:
        """Give up what is outstanding (the caller is stopping; nothing is acknowledged)."""
        for task in list(self._pending):
            task.cancel()
        while self._pending:
            await asyncio.wait(set(self._pending))
        self._last.clear()
        self._failure = None
