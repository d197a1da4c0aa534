"""Wire payloads in, readable reasons out: how a message that does not decode is classified.

Pure (pydantic and the contracts only). A payload that is not JSON at all is a ``decode``
error, one that is JSON but not the model a ``validation`` error; :func:`dead_letter_record`
is what a refused message becomes on the dead-letter stream. Every service classifies
decode errors here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeVar

from pydantic import BaseModel, ValidationError

from fracpilot_libs.contracts import DeadLetter, utcnow
from fracpilot_libs.validation import describe_validation_error

M = TypeVar("M", bound=BaseModel)
ErrorKind = Literal["decode", "validation", "processing", "max_deliveries"]


class DecodeError(ValueError):
    """A payload that is not the model it should be: ``kind`` says how, ``reason`` in words."""

    def __init__(self, kind: ErrorKind, reason: str) -> None:
        super().__init__(reason)
        self.kind: ErrorKind = kind
        self.reason = reason


def classify(exc: ValidationError) -> DecodeError:
    """The error a failed ``model_validate_json`` stands for: not JSON at all (``decode``,
    told apart by the error's type: the payload is parsed once), else ``validation``."""
    errors = exc.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        return DecodeError("decode", f"not valid JSON: {errors[0]['msg']}")
    return DecodeError("validation", describe_validation_error(exc))


def decode(model: type[M], data: bytes) -> M:
    """Parse a JSON payload into a model; raises :class:`DecodeError` with a readable reason."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise classify(exc) from exc


def raw_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return repr(data)


def dead_letter_record(
    service: str,
    subject: str,
    data: bytes,
    headers: Mapping[str, str] | None,
    kind: ErrorKind,
    reason: str,
) -> DeadLetter:
    """What the dead-letter stream keeps of a refused message: the reason and the raw payload."""
    return DeadLetter(
        service=service,
        subject=subject,
        reason=reason[:8000],
        error_kind=kind,
        raw_payload=raw_text(data),
        headers=dict(headers or {}),
        received_at=utcnow(),
    )
