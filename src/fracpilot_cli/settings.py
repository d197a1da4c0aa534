"""Settings of the ``fracpilot`` command: the services' shared ones (NATS, prices), from
the same ``FRACPILOT_`` environment, so the CLI sees what the services see."""

from __future__ import annotations

from fracpilot_libs.config import ServiceSettings


class CliSettings(ServiceSettings):
    """What the CLI reads from the environment."""
