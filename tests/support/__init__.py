"""Real servers and test exporters for integration tests that need more than NATS.

- :mod:`support.prometheus_server`: a real ``prometheus`` process (Debian's package, installed by
  ``scripts/install-servers.sh``) with a generated config and a temporary data dir.
- :mod:`support.gpu_exporter`: an HTTP exporter serving dcgm-exporter, HAMi vGPUmonitor and vLLM
  metrics built from small dataclasses, so a test knows every value Prometheus should return.

Both use only the standard library, so they do not depend on the code under test.
"""
