"""The one way to get a Kubernetes API client, and to call it without blocking the event loop.

The kubernetes client is synchronous: :func:`in_thread` runs one of its calls in a daemon
thread (not the loop's default executor, which ``asyncio.run`` joins at exit: a watch that
is still reading would hold the process) and waits for it at most ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from kubernetes import client, config

from fracpilot_libs.deadlines import within

T = TypeVar("T")


def make_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client from ``kubeconfig``, or the pod's ServiceAccount when it is unset."""
    if kubeconfig:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return api
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.done():  # the caller timed out or was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


def hand_over(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> bool:
    """Run ``callback`` on ``loop`` from another thread; False when the loop is gone."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        return False
    return True


async def in_thread(call: Callable[[], T], timeout_s: float, name: str = "kube-call") -> T:
    """``call()`` in a daemon thread; raises TimeoutError after ``timeout_s``.

    On a timeout the thread is left to finish on its own (give the call its own
    ``_request_timeout`` so that it does).
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def work() -> None:
        try:
            result = call()
        except BaseException as exc:  # handed to the awaiting coroutine
            hand_over(loop, partial(_settle, future, None, exc))
        else:
            hand_over(loop, partial(_settle, future, result, None))

    threading.Thread(target=work, name=name, daemon=True).start()
    return await within(future, timeout_s)
