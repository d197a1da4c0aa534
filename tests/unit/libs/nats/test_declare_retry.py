"""Stream and bucket declarations survive a JetStream election (nats/declare_retry)."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from fracpilot_libs.nats.declare_retry import declare_patiently
from fracpilot_libs.nats.errors import PermanentNatsError


class Declaration:
    """Fails with the given errors, in order, then answers."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "declared"


async def test_transient_errors_are_retried_until_the_declaration_succeeds() -> None:
    declare = Declaration(
        nats.errors.TimeoutError(),
        nats.js.errors.NoStreamResponseError(),
        nats.js.errors.ServiceUnavailableError(),
    )
    result = await declare_patiently(declare, "streams", first_delay_s=0.001, max_delay_s=0.01)
    assert (result, declare.calls) == ("declared", 4)


async def test_an_error_retrying_cannot_mend_is_raised_at_once() -> None:
    declare = Declaration(PermanentNatsError("not allowed"))
    with pytest.raises(PermanentNatsError):
        await declare_patiently(declare, "streams", first_delay_s=0.001)
    assert declare.calls == 1


async def test_the_last_error_is_raised_once_the_deadline_passes() -> None:
    declare = Declaration(*[nats.errors.TimeoutError() for _ in range(10_000)])
    with pytest.raises(nats.errors.TimeoutError):
        await declare_patiently(
            declare, "streams", deadline_s=0.2, first_delay_s=0.01, max_delay_s=0.02
        )
    assert 2 <= declare.calls < 10_000


async def test_a_stream_its_peers_cannot_place_yet_is_retried() -> None:
    # As nats-py raises JetStream's "no suitable peers for placement" (error 10005), seen at a
    # 3-node cluster's start-up: a peer not yet current in the meta group.
    refused = nats.js.errors.BadRequestError(
        code=400, err_code=10005, description="no suitable peers for placement, peer offline"
    )
    declare = Declaration(refused, refused)
    result = await declare_patiently(declare, "streams", first_delay_s=0.001, max_delay_s=0.01)
    assert (result, declare.calls) == ("declared", 3)


async def test_any_other_refusal_of_the_api_is_raised_at_once() -> None:
    declare = Declaration(
        nats.js.errors.BadRequestError(code=400, err_code=10058, description="stream name in use")
    )
    with pytest.raises(nats.js.errors.BadRequestError):
        await declare_patiently(declare, "streams", first_delay_s=0.001)
    assert declare.calls == 1
