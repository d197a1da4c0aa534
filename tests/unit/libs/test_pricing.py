"""The cost model: which price a GPU model gets, and what GPU-hours cost."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.pricing import DEFAULT_GPU_PRICES, GpuPrices, monthly


@pytest.mark.parametrize(
    ("model", "price"),
    [
        ("NVIDIA A100-SXM4-80GB", 3.40),  # the most specific entry wins
        ("NVIDIA A100-PCIE-40GB", 2.90),
        ("NVIDIA H100 80GB HBM3", 4.50),
        ("NVIDIA L40S", 1.90),  # not L40, not L4
        ("NVIDIA L4", 0.80),
        ("Tesla T4", 0.55),
        ("NVIDIA GeForce RTX 4090", 3.00),  # unknown: the default
        ("", 3.00),
        (None, 3.00),
    ],
)
def test_dcgm_model_names_get_their_price(model: str | None, price: float) -> None:
    assert GpuPrices().hourly(model) == price


def test_user_prices_extend_and_replace_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACPILOT_GPU_PRICES", '{"H100": 2.0, "B200": 6.5}')
    monkeypatch.setenv("FRACPILOT_GPU_DEFAULT_PRICE", "1.25")
    prices = ServiceSettings().prices
    assert prices.hourly("NVIDIA H100 80GB HBM3") == 2.0
    assert prices.hourly("NVIDIA B200") == 6.5
    assert prices.hourly("NVIDIA A100-SXM4-80GB") == DEFAULT_GPU_PRICES["A100 80GB"]
    assert prices.hourly("something else") == 1.25


@pytest.mark.parametrize("raw", ['{"H100": -1}', '{"H100": "NaN"}', "not json"])
def test_a_bad_price_is_refused_with_the_setting_named(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("FRACPILOT_GPU_PRICES", raw)
    with pytest.raises((ValidationError, ValueError), match="gpu_prices"):
        ServiceSettings().prices  # noqa: B018


def test_cost_and_month() -> None:
    prices = GpuPrices()
    assert prices.cost(10, "T4") == pytest.approx(5.5)
    assert monthly(1.0) == 730.0
    with pytest.raises(ValueError, match="finite"):
        prices.cost(math.nan, "T4")


@given(st.text(max_size=40))
def test_every_name_gets_a_known_price(name: str) -> None:
    prices = GpuPrices()
    known = set(DEFAULT_GPU_PRICES.values()) | {prices.default_usd_per_hour}
    assert prices.hourly(name) in known
