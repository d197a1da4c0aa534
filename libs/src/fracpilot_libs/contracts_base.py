"""What every wire contract is made of: the base model, the checked number and time types, the
schema version, and the workload a message is about (:mod:`fracpilot_libs.contracts` re-exports
them all)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1


def must_be_finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number (NaN and infinity are rejected)")
    return value


def _aware_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp must carry a timezone (UTC)")
    return value.astimezone(UTC)


FiniteFloat = Annotated[float, AfterValidator(must_be_finite)]
Share = Annotated[float, Field(ge=0.0, le=1.0), AfterValidator(must_be_finite)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0), AfterValidator(must_be_finite)]
UtcDatetime = Annotated[datetime, AfterValidator(_aware_utc)]
Bytes = Annotated[int, Field(ge=0)]


class WireModel(BaseModel):
    """Base of every message: immutable, strict about unknown fields, JSON on the wire."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class WorkloadRef(WireModel):
    """The owner a pod belongs to: decisions are per workload, not per pod."""

    cluster: str = Field(default="default", min_length=1, max_length=253)
    namespace: str = Field(min_length=1, max_length=63)
    owner_kind: str = Field(default="Deployment", min_length=1, max_length=63)
    owner_name: str = Field(min_length=1, max_length=253)

    @property
    def key(self) -> str:
        """Stable identity: ``cluster/namespace/kind/name``."""
        return f"{self.cluster}/{self.namespace}/{self.owner_kind}/{self.owner_name}"

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.owner_name}"
