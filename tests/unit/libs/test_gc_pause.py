"""The collector paused over a burst: nested and overlapping pauses, and back on after."""

from __future__ import annotations

import gc
import threading

from fracpilot_libs.gc_pause import gc_paused


def test_the_collector_is_off_inside_and_on_again_after_the_last_pause() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_a_pause_that_raises_turns_the_collector_on_again() -> None:
    try:
        with gc_paused():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.isenabled()


def test_a_collector_turned_off_before_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_pauses_of_two_threads() -> None:
    inside, release = threading.Event(), threading.Event()

    def worker() -> None:
        with gc_paused():
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=worker)
    thread.start()
    inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the worker's pause outlives ours
    release.set()
    thread.join(5)
    assert gc.isenabled()
