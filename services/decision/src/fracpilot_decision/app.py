"""Where the decision service is wired and run: settings from the environment, logging, the
service with its runtime (telemetry, bus, signals), until SIGTERM."""

from __future__ import annotations

import asyncio

from fracpilot_decision.service import SERVICE, DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.telemetry import setup_logging


def main() -> None:
    settings = DecisionSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(DecisionService(settings).run())


if __name__ == "__main__":
    main()
