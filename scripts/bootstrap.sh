#!/usr/bin/env bash
# Create .venv with every workspace package and the dev tools, from nothing but python3.
# uv is installed into its own small venv (.tools) so that `uv sync` never removes it; when uv
# cannot be had, pip installs the same packages (without the lockfile's exact pins).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
UV_VERSION=0.13.9

if command -v uv >/dev/null 2>&1; then
  UV=$(command -v uv)
elif [ -x .tools/bin/uv ]; then
  UV=.tools/bin/uv
else
  UV=""
  if "$PY" -m venv .tools >/dev/null && .tools/bin/pip install -q "uv==$UV_VERSION"; then
    UV=.tools/bin/uv
  else
    echo "bootstrap: could not install uv, falling back to pip" >&2
  fi
fi

if [ -n "$UV" ]; then
  lock_flag=--locked
  [ -f uv.lock ] || lock_flag=""
  "$UV" sync --all-packages $lock_flag --python "$PY"
else
  [ -d .venv ] || "$PY" -m venv .venv
  .venv/bin/pip install -q -e libs -e services/ingest -e services/decision -e services/actuator -e . \
    pytest pytest-asyncio pytest-timeout hypothesis mypy ruff import-linter testcontainers
fi
touch .venv/.bootstrapped
