"""The policy's memory-headroom settings (``Policy.memory_headroom``).

A pydantic model of its own, imported by :mod:`fracpilot_libs.contracts` (so it imports
nothing of fracpilot): the rule itself lives in :mod:`fracpilot_libs.sizing.headroom`. Field
names are single words, so the CRD spec spells them as the model does.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number (NaN and infinity are rejected)")
    return value


Finite = AfterValidator(_finite)


HEADROOM_DOC = (
    "the headroom above a workload's memory peak: mode uniform (the default: memory_margin "
    "and memory_min_headroom) or learned per workload (experimental; docs/sizing.md)"
)


class MemoryHeadroomMode(StrEnum):
    """How the engine chooses the headroom above a workload's memory peak."""

    UNIFORM = "uniform"  # one rule for all: max(memory_margin x peak, memory_min_headroom)
    LEARNED = "learned"  # per workload, from its own jumps above its peak (experimental)


class MemoryHeadroom(BaseModel):
    """The headroom above a workload's memory peak (``Policy.memory_headroom``)."""

    # The floor's and the cap's ranges do not overlap: the floor is never above the cap.

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mode: MemoryHeadroomMode = Field(
        default=MemoryHeadroomMode.UNIFORM,
        description="uniform: max(memory_margin x peak, memory_min_headroom) for every "
        "workload; learned: per workload, factor x its largest jump above its own peak over "
        "memory_window_s so far, within [floor, cap], raised at once by an overrun",
    )
    factor: Annotated[float, Field(ge=1.0, le=8.0), Finite] = Field(
        default=1.5, description="learned: safety factor on the largest jump seen (1.5)"
    )
    floor: Annotated[float, Field(gt=0.0, le=0.2), Finite] = Field(
        default=0.03, description="learned: least headroom, share of the device (0.03)"
    )
    cap: Annotated[float, Field(ge=0.2, le=1.0), Finite] = Field(
        default=0.25, description="learned: most headroom, share of the device (0.25)"
    )
    warmup: Annotated[float, Field(ge=0.0), Finite] = Field(
        default=2 * 3600.0,
        description="learned: seconds of history before the learned headroom replaces the "
        "uniform one (7200)",
    )

    def __str__(self) -> str:  # the CRD's "(default: ...)" and explanations
        return self.model_dump_json()
