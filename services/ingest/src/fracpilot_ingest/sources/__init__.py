"""Usage sources: each module implements :class:`~fracpilot_ingest.sources.base.Source`, and
:func:`make_sources` builds the configured ones from the settings (the one place)."""

from __future__ import annotations

from fracpilot_ingest.settings import IngestSettings
from fracpilot_ingest.sources.base import Source, SourceContext
from fracpilot_ingest.sources.prometheus import PrometheusSource
from fracpilot_ingest.sources.scrape import ScrapeSource, scrape_targets
from fracpilot_ingest.sources.simulator import SimulatorSource

SOURCES = ("simulator", "prometheus", "scrape")


def make_sources(settings: IngestSettings, context: SourceContext) -> list[Source]:
    """The sources ``FRACPILOT_SOURCES`` names, in its order; ValueError for an unknown one."""
    names = settings.source_list
    unknown = [s for s in names if s not in SOURCES]
    if unknown or not names:
        raise ValueError(f"unknown source(s) {unknown}; known: {', '.join(SOURCES)}")
    sources: list[Source] = []
    for name in names:
        if name == "prometheus":
            sources.append(
                PrometheusSource(
                    settings.prometheus,
                    interval_s=settings.interval_s,
                    backfill_s=settings.backfill_s,
                    context=context,
                )
            )
        elif name == "scrape":
            targets = scrape_targets(settings.scrape_targets)
            sources.append(ScrapeSource(targets, interval_s=settings.interval_s, context=context))
        else:
            sources.append(SimulatorSource(settings.sim, context))
    return sources
