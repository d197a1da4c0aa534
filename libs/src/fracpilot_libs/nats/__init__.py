"""Everything that speaks NATS: connections, JetStream streams and consumers, KV, subjects.

The services reach NATS only through this package (an import-linter contract: they import no
``nats``). Nothing is re-exported here and this module imports nothing, so that a pure module
importing ``fracpilot_libs.nats.subjects`` does not load the NATS client.
"""
