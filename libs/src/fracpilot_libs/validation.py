"""A pydantic validation error as one readable line: the reason a rejected message carries.

Pure (pydantic only), so pure cores (ingest's samples) and the bus's decoder share it.
"""

from __future__ import annotations

from pydantic import ValidationError


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
