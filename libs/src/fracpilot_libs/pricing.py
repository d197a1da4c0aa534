"""What a GPU-hour costs: the cost model behind "money saved" in the demo, replay, status,
report and dashboard.

Prices are per whole GPU-hour, keyed by GPU model. A model name as DCGM reports it
(``modelName="NVIDIA A100-SXM4-80GB"``) matches the table entry whose words it contains,
the most specific entry winning, so ``"A100 80GB"`` prices that card and ``"A100"`` every
other A100. A MIG instance's model (``"NVIDIA A100-SXM4-80GB MIG 3g.40gb"``) is priced as its
card: its samples' fractions are shares of the card (docs/mig.md, "One scale"), so the card's
price times the fraction is the instance's cost, and the profile's "40gb" must not match an
entry for a 40GB card. The defaults are rough on-demand cloud list prices (USD, late 2026) to
make the numbers meaningful out of the box; a platform team sets its own through the settings
``FRACPILOT_GPU_PRICES`` (a JSON object) and ``FRACPILOT_GPU_DEFAULT_PRICE``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from fracpilot_libs.mig.profiles import base_model

UsdPerHour = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]

DEFAULT_GPU_PRICES: dict[str, float] = {
    "H200": 5.50,
    "H100": 4.50,
    "A100 80GB": 3.40,
    "A100": 2.90,
    "L40S": 1.90,
    "L40": 1.60,
    "A10G": 1.20,
    "A10": 1.10,
    "L4": 0.80,
    "T4": 0.55,
}
DEFAULT_PRICE_USD_PER_HOUR = 3.00
HOURS_PER_MONTH = 730.0  # 365 * 24 / 12, the usual cloud billing month

_WORD = re.compile(r"[a-z0-9]+")


def _words(name: str) -> frozenset[str]:
    return frozenset(_WORD.findall(name.lower()))


class GpuPrices(BaseModel):
    """USD per whole GPU-hour by GPU model, with a price for models not in the table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd_per_hour: dict[str, UsdPerHour] = Field(default_factory=lambda: dict(DEFAULT_GPU_PRICES))
    default_usd_per_hour: UsdPerHour = DEFAULT_PRICE_USD_PER_HOUR

    @classmethod
    def with_overrides(
        cls, overrides: Mapping[str, float] | None = None, default: float | None = None
    ) -> GpuPrices:
        """The built-in table with the user's entries added or replacing ours."""
        table = dict(DEFAULT_GPU_PRICES)
        table.update(overrides or {})
        return cls(
            usd_per_hour=table,
            default_usd_per_hour=DEFAULT_PRICE_USD_PER_HOUR if default is None else default,
        )

    @cached_property
    def _entries(self) -> list[tuple[frozenset[str], float]]:
        # Most words first: "A100 80GB" must win over "A100" for an 80 GB card.
        entries = [(_words(name), price) for name, price in self.usd_per_hour.items()]
        return sorted(entries, key=lambda e: -len(e[0]))

    def hourly(self, gpu_model: str | None) -> float:
        """USD per hour of one whole GPU of this model (the default when unknown); a MIG
        instance's model gets its card's price."""
        if gpu_model:
            words = _words(base_model(gpu_model))
            for key, price in self._entries:
                if key and key <= words:
                    return price
        return self.default_usd_per_hour

    def cost(self, gpu_hours: float, gpu_model: str | None = None) -> float:
        """USD for this many GPU-hours of one model."""
        if not math.isfinite(gpu_hours):
            raise ValueError(f"gpu_hours must be finite, got {gpu_hours}")
        return gpu_hours * self.hourly(gpu_model)


def monthly(usd_per_hour: float) -> float:
    """A per-hour amount over a billing month."""
    return usd_per_hour * HOURS_PER_MONTH
