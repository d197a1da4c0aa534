"""Following a KV bucket: every current value, then every change, across reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import BaseModel

from fracpilot_libs.nats.consumer import DeadLetterer
from fracpilot_libs.nats.decoding import DecodeError, decode
from fracpilot_libs.nats.kv import KvBucket
from fracpilot_libs.nats.kv_initial import InitialValues

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


async def follow_kv(
    kv: KvBucket,
    watcher: Any,
    bucket: str,
    model: type[M],
    on_update: Callable[[str, M | None], Awaitable[None]],
    *,
    initial_done: asyncio.Event,
    stopping: asyncio.Event,
    reconnects: Callable[[], int],
    dead_letter: DeadLetterer,
) -> None:
    """Report every value of the bucket, then every change, until ``stopping``: a deleted key
    as ``None``, a value that does not decode dead-lettered. ``initial_done`` is set once
    every value present at the start has been reported. ``reconnects`` counts the
    connection's reconnects: the watcher (started by the caller, so that a failure to
    start it is the caller's) is started again after each."""
    subject = f"$KV.{bucket}"
    generation = reconnects()
    initial = InitialValues(watcher)
    while not stopping.is_set():
        if generation != reconnects():
            # A watcher is an ephemeral consumer: a restarted server has forgotten it and
            # nats-py does not notice, so start again from every current value.
            with contextlib.suppress(Exception):
                await watcher.stop()
            try:
                watcher = await kv.watch_all()
            except Exception as exc:
                log.warning("KV watch not restarted yet", extra={"error": str(exc)})
                await asyncio.sleep(0.5)
                continue
            generation = reconnects()
            initial = InitialValues(watcher)
            log.info("KV watch restarted after a reconnect", extra={"bucket": bucket})
        try:
            entry = await watcher.updates(timeout=0.5)
        except NatsTimeoutError:
            continue
        except Exception as exc:  # connection trouble: wait for the reconnect
            if stopping.is_set():
                break
            log.warning("KV watch failed", extra={"bucket": bucket, "error": str(exc)})
            await asyncio.sleep(0.5)
            continue
        if entry is not None:
            await _report(entry, subject, model, on_update, dead_letter)
        if not initial_done.is_set() and await initial.saw(entry):
            initial_done.set()  # every value present at the start reported
    with contextlib.suppress(Exception):
        await watcher.stop()


async def _report(
    entry: Any,
    subject: str,
    model: type[M],
    on_update: Callable[[str, M | None], Awaitable[None]],
    dead_letter: DeadLetterer,
) -> None:
    if entry.operation in ("DEL", "PURGE") or not entry.value:
        await on_update(entry.key, None)
        return
    try:
        value = decode(model, entry.value)
    except DecodeError as exc:
        await dead_letter(f"{subject}.{entry.key}", entry.value, None, exc.kind, exc.reason)
        return
    await on_update(entry.key, value)
