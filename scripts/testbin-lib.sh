# Sourced (not run) by scripts/k8s-testbin.sh and scripts/gpu-stack-testbin.sh: logging and
# timing, and the cached-or-locked check both make before they build. The sourcing script sets
# TESTBIN_NAME (the log prefix) first; before calling exit_if_cached it sets ROOT (the cache dir)
# and BIN, and defines up_to_date (true when the cached build is complete).

log() { printf '%s: %s\n' "$TESTBIN_NAME" "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
T0=$(now)

# When the cache is up to date, print $BIN and exit. Else take the cache dir's lock (one build at
# a time per cache dir: two clones, or a pytest run racing `make test`), look again (another
# process may have built it meanwhile) and return holding the lock, to build.
exit_if_cached() {
  mkdir -p "$ROOT"
  if up_to_date; then
    log "cached in $BIN ($(since "$T0"))"
    echo "$BIN"
    exit 0
  fi
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$ROOT/.lock"
    flock 9
    if up_to_date; then
      log "built by another process, cached in $BIN ($(since "$T0"))"
      echo "$BIN"
      exit 0
    fi
  fi
}
