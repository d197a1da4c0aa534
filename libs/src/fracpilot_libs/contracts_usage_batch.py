"""The usage batch's header line (re-exported by :mod:`fracpilot_libs.contracts`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fracpilot_libs.contracts_base import WireModel

USAGE_BATCH_FORMAT: Literal[1] = 1


class UsageBatchHeader(WireModel):
    """The first line of a usage batch: the samples of one partition from one scrape instant,
    one ``UsageSample`` JSON per line after it (:mod:`fracpilot_libs.nats.usage_batch`)."""

    batch_format: Literal[1] = Field(
        default=USAGE_BATCH_FORMAT, description="the batch wire format's version"
    )
    batch_id: str = Field(
        min_length=1, max_length=200, description="also the message's Nats-Msg-Id"
    )
    partition: int = Field(ge=0, description="the usage partition the samples belong to")
    partitions: int = Field(ge=1, description="the partition count the publisher grouped by")
    samples: int = Field(ge=0, description="how many sample lines follow")
