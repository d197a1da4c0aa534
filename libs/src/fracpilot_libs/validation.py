"""A pydantic validation error as one readable line: the reason a rejected message carries.

Pure (pydantic only), so pure cores (ingest's samples) and the bus's decoder share it.
"""

from __future__ import annotations

from pydantic import ValidationError

# The reason goes into replies and logs: a list of 50,000 bad items made a 2.5 MB one, over
# NATS' max_payload, so the policy endpoint could not answer at all.
LISTED_ERRORS = 20
PART_CHARS = 300


def describe_validation_error(exc: ValidationError) -> str:
    """The first :data:`LISTED_ERRORS` errors (each cut at :data:`PART_CHARS`), then how many
    more there are."""
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors[:LISTED_ERRORS]:
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}"[:PART_CHARS])
    if len(errors) > LISTED_ERRORS:
        parts.append(f"and {len(errors) - LISTED_ERRORS} more")
    return "; ".join(parts)
