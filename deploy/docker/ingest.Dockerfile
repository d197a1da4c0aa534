# syntax=docker/dockerfile:1
# fracpilot ingest: Usage sources in, UsageSample messages out. The same image runs the Compose stack's
# dcgm-exporter simulator: python -m fracpilot_ingest.simulated.dcgm_exporter.
#
# Build from the repository root (the build context):
#   docker build -f deploy/docker/ingest.Dockerfile -t ghcr.io/fracpilot/fracpilot-ingest .
# The builder installs exactly what uv.lock pins for fracpilot-ingest (no dev tools, no other
# service) into a virtual environment; the runtime image holds that environment and Python.
# It runs as uid 10001 and writes nothing outside /tmp: run it with a read-only root
# filesystem and a tmpfs (Compose: tmpfs: [/tmp]) or an emptyDir (Kubernetes) on /tmp.
# uv's version matches scripts/bootstrap.sh (UV_VERSION), so the lock reads the same.

ARG PYTHON_VERSION=3.11

FROM ghcr.io/astral-sh/uv:0.13.9 AS uv

FROM python:${PYTHON_VERSION}-slim AS builder
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/fracpilot
WORKDIR /src
# The workspace's manifests and the lock first, so the dependency layer is rebuilt only when
# they change (uv needs every member's pyproject.toml to check the lock).
COPY pyproject.toml uv.lock ./
COPY libs/pyproject.toml libs/
COPY services/ingest/pyproject.toml services/ingest/
COPY services/decision/pyproject.toml services/decision/
COPY services/actuator/pyproject.toml services/actuator/
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --no-dev --no-install-workspace --package fracpilot-ingest
COPY libs/src libs/src
COPY services/ingest/src services/ingest/src
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --no-dev --no-editable --package fracpilot-ingest

FROM python:${PYTHON_VERSION}-slim
# OCI labels; the version is the release's (tests/unit/test_version.py checks it against
# pyproject.toml and the chart).
LABEL org.opencontainers.image.title="fracpilot-ingest" \
      org.opencontainers.image.description="fracpilot ingest: GPU usage from Prometheus or exporters in, UsageSample messages out" \
      org.opencontainers.image.source="https://github.com/fracpilot/fracpilot" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
# The base image ships the standard library without bytecode: compile it once here.
RUN python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" \
    && groupadd --system --gid 10001 fracpilot \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin fracpilot
COPY --from=builder /opt/fracpilot /opt/fracpilot
# Bytecode was compiled at build time; nothing is written at run time (read-only root).
ENV PATH=/opt/fracpilot/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    FRACPILOT_METRICS_HOST=0.0.0.0 \
    FRACPILOT_METRICS_PORT=9090
USER 10001:10001
EXPOSE 9090
# The slim image has no curl: Python asks /healthz on the telemetry port.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('FRACPILOT_METRICS_PORT', '9090') + '/healthz', timeout=3)"]
CMD ["python", "-m", "fracpilot_ingest"]
