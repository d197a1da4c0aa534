#!/usr/bin/env bash
# Build, once per machine, the binaries the Kubernetes tests start: kube-apiserver, the etcd that
# Kubernetes pins, and helm v3, all from their Go modules (the Go module proxy is the only source;
# no Docker, no release downloads). Idempotent: when the cached binaries exist and report the
# expected versions it exits in well under a second.
#
#   scripts/k8s-testbin.sh            # build if needed, then print the bin directory on stdout
#
# Cache:  ${FRACPILOT_K8S_TESTBIN:-$HOME/.cache/fracpilot/k8s-testbin/<k8s-version>}/{bin,src}
#         outside the repository, so every clone on the machine shares one build. src/ holds the
#         wrapper Go module (example.invalid/k8stestbin) that this script writes: k8s.io/kubernetes
#         cannot be `go install`ed (its go.mod points every staging module at ./staging), so the
#         wrapper requires it and replaces each staging module with its published v0.X.Y twin.
# Needs:  go (>= the go line of k/k's go.mod; GOTOOLCHAIN=local, so an older Go fails fast).
# Tunes:  FRACPILOT_K8S_VERSION, FRACPILOT_HELM_VERSION (defaults pinned below).
# Cost:   cold: ~1 GB of modules (GOMODCACHE), ~3 GB of GOCACHE, 5.5-7 min on 2 cores;
#         cached: ~0.2 s (the stamp plus each binary's --version).
set -euo pipefail

K8S_VERSION=${FRACPILOT_K8S_VERSION:-v1.35.4}   # newest 1.35 patch on the module proxy
HELM_VERSION=${FRACPILOT_HELM_VERSION:-v3.22.0} # newest helm v3 on the module proxy
RECIPE=1 # bump when the build flags below change, so cached binaries are rebuilt
ROOT=${FRACPILOT_K8S_TESTBIN:-${HOME:?HOME or FRACPILOT_K8S_TESTBIN must be set}/.cache/fracpilot/k8s-testbin/$K8S_VERSION}
BIN=$ROOT/bin
SRC=$ROOT/src
STAMP=$BIN/.stamp

TESTBIN_NAME=k8s-testbin
# log, now, since, T0 and exit_if_cached:
# shellcheck source=scripts/testbin-lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/testbin-lib.sh"

# Up to date when the stamp names these versions and every binary answers with its version.
up_to_date() {
  [ -f "$STAMP" ] || return 1
  local k8s etcd helm
  k8s=$(sed -n 's/^kubernetes=//p' "$STAMP")
  etcd=$(sed -n 's/^etcd=//p' "$STAMP")
  helm=$(sed -n 's/^helm=//p' "$STAMP")
  [ "$k8s" = "$K8S_VERSION" ] && [ "$helm" = "$HELM_VERSION" ] && [ -n "$etcd" ] || return 1
  grep -qx "recipe=$RECIPE" "$STAMP" || return 1
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/etcd" ] && [ -x "$BIN/helm" ] || return 1
  [ "$("$BIN/kube-apiserver" --version 2>/dev/null)" = "Kubernetes $K8S_VERSION" ] || return 1
  # Read whole, then matched: with pipefail, `etcd --version | grep -q` fails whenever grep
  # exits before etcd has written its last line (SIGPIPE), which under load made a cached
  # build look stale, and its rebuild removed the stamp under the other test workers.
  local etcd_says
  etcd_says=$("$BIN/etcd" --version 2>/dev/null) || return 1
  grep -qx "etcd Version: ${etcd#v}" <<<"$etcd_says" || return 1
  [ "$("$BIN/helm" version --short 2>/dev/null | cut -d+ -f1)" = "$HELM_VERSION" ] || return 1
}

exit_if_cached

command -v go >/dev/null 2>&1 || { log "needs Go (https://go.dev/dl/) to build $K8S_VERSION"; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off GO111MODULE=on
log "building kube-apiserver $K8S_VERSION, etcd and helm $HELM_VERSION with $(go version) into $BIN"

MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
STAGING_VERSION=v0.${K8S_VERSION#v1.} # v1.35.4 -> v0.35.4
rm -f "$STAMP"
mkdir -p "$BIN" "$SRC"
cd "$SRC"

# k/k's go.mod tells the go line, the godebug defaults, the staging modules and the pinned etcd.
t=$(now)
KK_MOD=$(go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@$K8S_VERSION")
KK_TIME=$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "k8s.io/kubernetes@$K8S_VERSION")
GO_LINE=$(awk '$1 == "go" { print $2; exit }' "$KK_MOD")
GODEBUG_LINES=$(awk '/^godebug[ \t]*\(/, /^\)/ { print; next } /^godebug[ \t]/ { print }' "$KK_MOD")
STAGING=$(sed -n 's#^\(replace[[:space:]]\{1,\}\)\{0,1\}[[:space:]]*\(k8s\.io/[^[:space:]]\{1,\}\)[[:space:]]\{1,\}=>[[:space:]]\{1,\}\./staging/.*#\2#p' "$KK_MOD")
ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' "$KK_MOD")
if [ -z "$GO_LINE" ] || [ -z "$STAGING" ] || [ -z "$ETCD_VERSION" ]; then
  log "could not read go line, staging modules or etcd version from $KK_MOD"
  exit 1
fi
{
  echo "// Written by fracpilot scripts/k8s-testbin.sh: builds kube-apiserver $K8S_VERSION and etcd."
  echo "module example.invalid/k8stestbin"
  echo
  echo "go $GO_LINE"
  echo
  [ -z "$GODEBUG_LINES" ] || printf '%s\n\n' "$GODEBUG_LINES"
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  for m in $STAGING; do printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"; done
  echo ")"
} >go.mod
rm -f go.sum
log "wrote $SRC/go.mod: go $GO_LINE, $(echo "$STAGING" | wc -w) staging replaces at $STAGING_VERSION, etcd $ETCD_VERSION"
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
SELECTED_ETCD=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
[ "$SELECTED_ETCD" = "$ETCD_VERSION" ] || log "warning: module graph selected etcd $SELECTED_ETCD, k/k pins $ETCD_VERSION"
log "resolved modules ($(since "$t"))"

# Flags as k/k's hack/lib/golang.sh builds server binaries, version stamps as hack/lib/version.sh.
TAGS=selinux,notest,grpcnotrace
kv_ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR"
  # The module zip carries no commit: an empty gitCommit beats the "$Format:%H$" placeholder.
  kv_ldflags+=" -X $p.gitCommit= -X $p.gitTreeState=archive -X $p.buildDate=$KK_TIME"
done
t=$(now)
go build -trimpath -tags "$TAGS" -ldflags "-s -w$kv_ldflags" -o "$BIN/kube-apiserver" \
  k8s.io/kubernetes/cmd/kube-apiserver
log "built kube-apiserver ($(since "$t"))"
t=$(now)
go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
  -o "$BIN/etcd" go.etcd.io/etcd/server/v3
log "built etcd $ETCD_VERSION ($(since "$t"))"

# helm in its own `go install` (helm's go.mod has no replaces; the staging replaces above would
# force its Kubernetes libraries). Link in the Kubernetes version for .Capabilities.KubeVersion and
# lint, else helm assumes v1.20 and rejects charts with `kubeVersion: >=1.2x`.
t=$(now)
H=helm.sh/helm/v3
helm_ldflags="-s -w -X $H/internal/version.version=$HELM_VERSION -X $H/internal/version.gitTreeState=clean"
for p in $H/pkg/chartutil $H/pkg/lint/rules; do
  helm_ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$MINOR"
done
(cd "$ROOT" && GOBIN="$BIN" go install -trimpath -ldflags "$helm_ldflags" "$H/cmd/helm@$HELM_VERSION")
log "built helm $HELM_VERSION ($(since "$t"))"

printf 'kubernetes=%s\netcd=%s\nhelm=%s\nrecipe=%s\ngo=%s\n' \
  "$K8S_VERSION" "$ETCD_VERSION" "$HELM_VERSION" "$RECIPE" "$(go env GOVERSION)" >"$STAMP"
up_to_date || { log "built binaries do not report the expected versions:"; \
  "$BIN/kube-apiserver" --version >&2; "$BIN/etcd" --version >&2; "$BIN/helm" version >&2; exit 1; }
log "done in $(since "$T0")"
echo "$BIN"
