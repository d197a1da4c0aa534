"""Pure models of what the demo simulates (no I/O): the ingest service's simulated source and
the DCGM exporter simulator read them, and ``fracpilot demo`` names its workloads from them."""
