"""Kubernetes resource quantities as kube-scheduler counts them.

``quantity`` parses ``resource.Quantity`` strings (``k8s.io/apimachinery/pkg/api/resource``:
binary and decimal suffixes, exponents, milli); :class:`Resources` holds CPU in millicores and
memory and ephemeral storage in bytes, rounded up as ``Quantity.MilliValue``/``Value`` do.
Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(e[+-]?\d+|E[+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_SUFFIX = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
}


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (``"500m"``, ``"2Gi"``, ``"1e3"``, ``4``); ValueError otherwise."""
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, suffix = match.groups()
    try:
        if suffix and suffix[0] in "eE" and len(suffix) > 1:
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX.get(suffix or "", Decimal(1))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a number") from None


@dataclass(frozen=True)
class Resources:
    """What kube-scheduler counts: CPU in millicores, memory and ephemeral storage in bytes
    (rounded up, as ``Quantity.MilliValue``/``Value`` do)."""

    cpu_milli: int = 0
    memory: int = 0
    ephemeral_storage: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.memory + other.memory,
            self.ephemeral_storage + other.ephemeral_storage,
        )

    def max(self, other: Resources) -> Resources:
        return Resources(
            max(self.cpu_milli, other.cpu_milli),
            max(self.memory, other.memory),
            max(self.ephemeral_storage, other.ephemeral_storage),
        )

    @property
    def zero(self) -> bool:
        return not (self.cpu_milli or self.memory or self.ephemeral_storage)


def resources_of(values: Mapping[str, Any] | None) -> Resources:
    values = values or {}

    def amount(name: str, scale: int) -> int:
        return math.ceil(quantity(values[name]) * scale) if name in values else 0

    return Resources(amount("cpu", 1000), amount("memory", 1), amount("ephemeral-storage", 1))
