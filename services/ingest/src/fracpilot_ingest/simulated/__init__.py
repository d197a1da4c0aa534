"""Simulators shipped with ingest for the demo and docker-compose (entry points, named in
docs/architecture.md): ``dcgm_exporter`` serves dcgm-exporter's series for simulated GPUs."""
