"""Building many objects at once without the cyclic garbage collector walking them again."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """No cyclic garbage collection while tens of thousands of objects are built and kept:
    each collection would walk them all again (a fifth of the CPU time of a large status).
    Reference counting still frees what is dropped."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
