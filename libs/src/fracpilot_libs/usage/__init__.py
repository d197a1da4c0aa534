"""From exporters' series to ``UsageSample`` messages, pure: the one path ingest and
``fracpilot recommend`` share (mappings, attribution, MIG instances, samples, signals, range
queries' answers)."""
