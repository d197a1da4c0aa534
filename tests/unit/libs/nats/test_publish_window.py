"""The publish window: at most ``size`` outstanding, one per key in order, back-pressure when
full, the first failure raised by the drain and the rest of its key not sent."""

from __future__ import annotations

import asyncio

import pytest

from fracpilot_libs.nats.publish_window import OnAcked, PublishSkippedError, PublishWindow


class Server:
    """Acknowledges each publish when told to (``release``), or fails the ids in ``failing``."""

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.sent: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.gate = asyncio.Event()
        self.failing = failing

    async def send(self, subject: str, body: bytes, msg_id: str) -> bool:
        self.sent.append(msg_id)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            if msg_id in self.failing:
                raise ConnectionError(msg_id)
            return True
        finally:
            self.in_flight -= 1


async def test_a_full_window_holds_the_submitter_back() -> None:
    server = Server()
    window = PublishWindow(server.send, size=3)
    acked: list[bool] = []

    async def on_acked(stored: bool) -> None:
        acked.append(stored)

    for key in range(3):
        await window.submit(key, "s", b"", f"m{key}", on_acked)
    fourth = asyncio.create_task(window.submit(3, "s", b"", "m3", on_acked))
    await asyncio.sleep(0.01)
    assert not fourth.done()  # back-pressure: three outstanding
    assert window.outstanding == 3
    server.gate.set()
    await fourth
    await window.drain()
    assert acked == [True] * 4
    assert server.most_in_flight == 3


async def test_one_key_is_sent_in_order_one_at_a_time() -> None:
    server = Server()
    server.gate.set()
    window = PublishWindow(server.send, size=8)

    async def on_acked(stored: bool) -> None:
        pass

    for i in range(6):
        await window.submit("p0", "s", b"", f"a{i}", on_acked)
        await window.submit("p1", "s", b"", f"b{i}", on_acked)
    await window.drain()
    assert [m for m in server.sent if m[0] == "a"] == [f"a{i}" for i in range(6)]
    assert server.most_in_flight <= 2  # one per key


async def test_a_failure_stops_its_key_and_is_raised_by_the_drain() -> None:
    server = Server(failing=frozenset({"a1"}))
    server.gate.set()
    window = PublishWindow(server.send, size=8)
    acked: list[str] = []

    def note(msg_id: str) -> OnAcked:
        async def on_acked(stored: bool) -> None:
            acked.append(msg_id)

        return on_acked

    for i in range(3):
        await window.submit("p0", "s", b"", f"a{i}", note(f"a{i}"))
    await window.submit("p1", "s", b"", "b0", note("b0"))
    with pytest.raises(ConnectionError):
        await window.drain()
    assert "a2" not in server.sent  # after the failed one of its key: not sent
    assert sorted(acked) == ["a0", "b0"]
    await window.drain()  # the failure is raised once; the window is usable again
    with pytest.raises(ValueError, match="at least one"):
        PublishWindow(server.send, size=0)
    assert issubclass(PublishSkippedError, RuntimeError)


async def test_a_round_of_one_key_goes_together_after_the_rounds_before() -> None:
    server = Server()
    window = PublishWindow(server.send, size=16)

    async def on_acked(stored: bool) -> None:
        pass

    for i in range(3):  # one instant's three batches of partition p0
        await window.submit("p0", "s", b"", f"t0-{i}", on_acked, round_id="t0")
    for i in range(2):  # the next instant's
        await window.submit("p0", "s", b"", f"t1-{i}", on_acked, round_id="t1")
    await asyncio.sleep(0.01)
    assert sorted(server.sent) == ["t0-0", "t0-1", "t0-2"]  # together; t1 waits for all of t0
    assert server.in_flight == 3
    server.gate.set()
    await window.drain()
    assert server.sent[3:] == ["t1-0", "t1-1"]


async def test_a_failure_in_a_round_stops_the_rounds_after_it_not_its_own() -> None:
    server = Server(failing=frozenset({"t0-1"}))
    server.gate.set()
    window = PublishWindow(server.send, size=16)
    acked: list[str] = []

    def note(msg_id: str) -> OnAcked:
        async def on_acked(stored: bool) -> None:
            acked.append(msg_id)

        return on_acked

    for t in range(3):
        for i in range(2):
            await window.submit("p0", "s", b"", f"t{t}-{i}", note(f"t{t}-{i}"), round_id=t)
    with pytest.raises(ConnectionError):
        await window.drain()
    assert sorted(server.sent) == ["t0-0", "t0-1"]  # t1 and t2 after a failed round: not sent
    assert acked == ["t0-0"]
