"""The one place that runs ingest: settings from the environment, logging, the service.

The service wires its parts from the settings: sources
(:func:`fracpilot_ingest.sources.make_sources`), owners
(:func:`fracpilot_ingest.owners.make_owners`), metrics (:mod:`fracpilot_ingest.metrics`).
"""

from __future__ import annotations

import asyncio

from fracpilot_ingest.service import SERVICE, IngestService
from fracpilot_ingest.settings import IngestSettings


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = IngestSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(IngestService(settings).run())


if __name__ == "__main__":
    main()
