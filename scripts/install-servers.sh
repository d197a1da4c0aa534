#!/usr/bin/env bash
# Install the servers the test suite starts by itself (beyond NATS, which comes from a wheel):
#   - prometheus: Debian's `prometheus` package, for the ingest tests (tests/support/prometheus_server.py).
#   - chromium: Debian's `chromium` package, which opens `fracpilot report`'s HTML headless
#     (tests/integration/test_report_chromium.py). FRACPILOT_CHROMIUM_BIN names another binary.
# Idempotent and fast when already installed: it only checks `prometheus --version`.
# Installing needs root (or sudo) and apt; no service is left running: a policy-rc.d forbids
# service starts while the package installs, and any prometheus the install started is stopped.
# FRACPILOT_PROMETHEUS_BIN names a prometheus binary to use instead (then nothing is installed).
set -euo pipefail

usable() { [ -n "$1" ] && "$1" --version >/dev/null 2>&1; }

# can_install PACKAGE OVERRIDE_VAR: exit with the reason unless apt may install PACKAGE (a
# binary named by OVERRIDE_VAR that does not run is an error, not a reason to install); sets
# SUDO to the prefix apt needs.
can_install() {
  local package=$1 override=$2
  if [ -n "${!override:-}" ]; then
    echo "install-servers: $override=${!override} does not run" >&2
    exit 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "install-servers: $package is missing and installing it needs root (apt-get)" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-servers: $package is missing and there is no apt-get; install it or set" \
      "$override" >&2
    exit 1
  fi
}

prom=${FRACPILOT_PROMETHEUS_BIN:-$(command -v prometheus || true)}
[ -z "$prom" ] && [ -x /usr/bin/prometheus ] && prom=/usr/bin/prometheus

if ! usable "$prom"; then
  can_install prometheus FRACPILOT_PROMETHEUS_BIN

  echo "install-servers: installing Debian's prometheus package" >&2
  before=$(pgrep -x prometheus || true)
  policy=/usr/sbin/policy-rc.d
  backup=""
  if [ -e "$policy" ]; then
    backup=$(mktemp)
    "${SUDO[@]}" cp -p "$policy" "$backup"
  fi
  restore_policy() {
    if [ -n "$backup" ]; then
      "${SUDO[@]}" cp -p "$backup" "$policy"
      rm -f "$backup"
    else
      "${SUDO[@]}" rm -f "$policy"
    fi
  }
  trap restore_policy EXIT
  # 101: "action not allowed" - invoke-rc.d and deb-systemd-invoke then start no service.
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
  "${SUDO[@]}" chmod 755 "$policy"

  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null

  restore_policy
  trap - EXIT

  # A prometheus started by the package despite the policy (there is no systemd here) would
  # hold :9090; stop only processes that were not running before the install.
  for pid in $(pgrep -x prometheus || true); do
    if ! grep -qx "$pid" <<<"$before"; then
      echo "install-servers: stopping prometheus $pid started by the package" >&2
      "${SUDO[@]}" kill "$pid" || true
    fi
  done
  prom=$(command -v prometheus || echo /usr/bin/prometheus)
  if ! usable "$prom"; then
    echo "install-servers: prometheus was installed but does not run" >&2
    exit 1
  fi
fi

# The first line of each version (read whole first: `| head` under pipefail fails on SIGPIPE).
version=$("$prom" --version 2>&1)
echo "${version%%$'\n'*}"

# chromium: installed only when missing, like prometheus (no service comes with it).
chrome=${FRACPILOT_CHROMIUM_BIN:-$(command -v chromium || true)}
if ! usable "$chrome"; then
  can_install chromium FRACPILOT_CHROMIUM_BIN
  echo "install-servers: installing Debian's chromium package" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
  chrome=$(command -v chromium || echo /usr/bin/chromium)
  if ! usable "$chrome"; then
    echo "install-servers: chromium was installed but does not run" >&2
    exit 1
  fi
fi
version=$("$chrome" --version 2>/dev/null)
echo "${version%%$'\n'*}"
