#!/usr/bin/env bash
# Build, once per machine, the real GPU scheduling stack the tests in tests/integration/gpu_stack
# start next to the loopback kube-apiserver: kwok (fake nodes and pod lifecycle), KAI-Scheduler
# (scheduler, binder, podgrouper, admission, nodescaleadjuster, queuecontroller,
# podgroupcontroller), kube-scheduler and kube-controller-manager, and cluster-autoscaler with its
# kwok cloud provider. Everything comes from the Go module proxy (no Docker, no release
# downloads). Idempotent: when the cached binaries match the pinned versions it exits in well
# under a second.
#
#   scripts/gpu-stack-testbin.sh      # build if needed, then print the bin directory on stdout
#
# Cache:  ${FRACPILOT_GPU_STACK_TESTBIN:-$HOME/.cache/fracpilot/gpu-stack-testbin/<versions>}/
#           bin/     the binaries (KAI's prefixed kai-)
#           crds/    KAI's CRDs from the module (deployments/kai-scheduler/crds/)
#           stages/  kwok's upstream stage files (node and pod lifecycle)
#           src/     the wrapper Go modules, written from scripts/gpu-stack/ (see the comments
#                    there: the proxy serves exact allow-listed versions only, with no version
#                    lists, so `go install pkg@version` does not work for KAI and CA)
# Needs:  go >= 1.24.4 (GOTOOLCHAIN=local), and scripts/k8s-testbin.sh (run first: kube-scheduler
#         and kube-controller-manager are built from the same wrapper module as kube-apiserver,
#         so they reuse its module and build caches).
# Cost:   cold: ~15 min on 2 idle cores (kwok 3.5, KAI 6.5, CA 4, kube-* 1.2), ~2 GB more of
#         GOMODCACHE + GOCACHE, ~650 MB of binaries; relinking with warm Go caches: ~1 min
#         (~25 s measured after a wrapper change);
#         cached: ~0.5 s.
# Facts:  ../shared/reference/real-gpu-scheduler.md (the verified recipe this follows).
set -euo pipefail

KWOK_VERSION=v0.8.0
KAI_VERSION=v0.12.0                               # the only KAI version the proxy serves
CA_VERSION=v0.0.0-20250613073258-1959f5f61f6c     # the only CA version served with cloudprovider/kwok
CA_APIS_VERSION=v0.0.0-20240627115740-d52e4b9665d7 # the only CA apis version served
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WRAPPERS=$HERE/gpu-stack
TESTBIN_NAME=gpu-stack-testbin
# log, now, since, T0 and exit_if_cached:
# shellcheck source=scripts/testbin-lib.sh
source "$HERE/testbin-lib.sh"

# kube-scheduler/kube-controller-manager follow the apiserver's version (FRACPILOT_K8S_VERSION).
K8S_BIN=$(bash "$HERE/k8s-testbin.sh") || { log "scripts/k8s-testbin.sh failed (see above)"; exit 1; }
K8S_SRC=$(dirname "$K8S_BIN")/src
K8S_VERSION=$(sed -n 's/^kubernetes=//p' "$K8S_BIN/.stamp")

# Editing a wrapper file must rebuild: its digest is part of the stamp.
RECIPE=$(cd "$WRAPPERS" && find ca kai -type f | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12)
ROOT=${FRACPILOT_GPU_STACK_TESTBIN:-${HOME:?HOME or FRACPILOT_GPU_STACK_TESTBIN must be set}/.cache/fracpilot/gpu-stack-testbin/kai-$KAI_VERSION.kwok-$KWOK_VERSION.ca-${CA_VERSION##*-}.k8s-$K8S_VERSION}
BIN=$ROOT/bin
SRC=$ROOT/src
STAMP=$BIN/.stamp
KAI_CMDS="scheduler binder podgrouper admission nodescaleadjuster queuecontroller podgroupcontroller"
BINARIES="kwok cluster-autoscaler kube-scheduler kube-controller-manager"
for c in $KAI_CMDS; do BINARIES+=" kai-$c"; done
KWOK_STAGES="node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml"

stamp_text() {
  printf 'kwok=%s\nkai=%s\ncluster-autoscaler=%s\nkubernetes=%s\nrecipe=%s\n' \
    "$KWOK_VERSION" "$KAI_VERSION" "$CA_VERSION" "$K8S_VERSION" "$RECIPE"
}

up_to_date() {
  [ -f "$STAMP" ] && [ "$(head -5 "$STAMP")" = "$(stamp_text)" ] || return 1
  local b
  for b in $BINARIES; do [ -x "$BIN/$b" ] || return 1; done
  ls "$ROOT"/crds/scheduling.run.ai_queues.yaml "$ROOT"/stages/pod-ready.yaml >/dev/null 2>&1 || return 1
  [ "$("$BIN/kube-scheduler" --version 2>/dev/null)" = "Kubernetes $K8S_VERSION" ] || return 1
  [ "$("$BIN/kube-controller-manager" --version 2>/dev/null)" = "Kubernetes $K8S_VERSION" ] || return 1
}

exit_if_cached

command -v go >/dev/null 2>&1 || { log "needs Go >= 1.24.4 (https://go.dev/dl/)"; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off GO111MODULE=on
log "building kwok $KWOK_VERSION, KAI $KAI_VERSION, cluster-autoscaler $CA_VERSION," \
  "kube-scheduler/kube-controller-manager $K8S_VERSION with $(go version) into $BIN"
rm -f "$STAMP"
mkdir -p "$BIN" "$SRC" "$ROOT/crds" "$ROOT/stages"

# Run a step; on failure name it, so the log says which build broke.
step() {
  local what=$1 t
  shift
  t=$(now)
  "$@" || { log "FAILED: $what (command: $*)"; exit 1; }
  log "$what ($(since "$t"))"
}
module_dir() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }

# --- kwok: kwok's go.mod has no replaces, so a plain install of the exact version works.
step "built kwok $KWOK_VERSION" \
  env GOBIN="$BIN" sh -c "cd '$ROOT' && go install -trimpath -ldflags '-s -w' sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
KWOK_DIR=$(cd "$ROOT" && module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")
for s in $KWOK_STAGES; do
  [ -f "$KWOK_DIR/kustomize/stage/$s" ] || { log "kwok module lacks kustomize/stage/$s"; exit 1; }
  install -m 0644 "$KWOK_DIR/kustomize/stage/$s" "$ROOT/stages/"
done

# --- KAI-Scheduler: wrapper module (scripts/gpu-stack/kai), one go build for all commands.
# nodescaleadjuster and podgroupcontroller are built from the wrapper's own mains (kai/cmd/*),
# which call KAI's unchanged app packages with a working --metrics-bind-address: upstream both
# bind :8080 whatever the flags say (see those files), so they could not run side by side.
OWN_MAINS="nodescaleadjuster podgroupcontroller"
rm -rf "$SRC/kai"
mkdir -p "$SRC/kai/out"
cp -R "$WRAPPERS/kai/." "$SRC/kai/"
cd "$SRC/kai"
step "resolved KAI modules (go mod tidy)" go mod tidy
KAI_PKGS=""
for c in $KAI_CMDS; do
  case " $OWN_MAINS " in
    *" $c "*) KAI_PKGS+=" ./cmd/$c" ;;
    *) KAI_PKGS+=" github.com/NVIDIA/KAI-scheduler/cmd/$c" ;;
  esac
done
# shellcheck disable=SC2086 # word splitting intended
step "built KAI $KAI_VERSION: $KAI_CMDS" go build -trimpath -ldflags "-s -w" -o "$SRC/kai/out/" $KAI_PKGS
for c in $KAI_CMDS; do mv -f "$SRC/kai/out/$c" "$BIN/kai-$c"; done
KAI_DIR=$(go list -m -f '{{.Dir}}' github.com/NVIDIA/KAI-scheduler)
ls "$KAI_DIR"/deployments/kai-scheduler/crds/*.yaml >/dev/null 2>&1 \
  || { log "KAI module lacks deployments/kai-scheduler/crds/*.yaml"; exit 1; }
install -m 0644 "$KAI_DIR"/deployments/kai-scheduler/crds/*.yaml "$ROOT/crds/"

# --- cluster-autoscaler: wrapper module (scripts/gpu-stack/ca) plus a local copy of its apis
# sub-module: the served 2024 version has the ProvisioningRequest API as v1beta1, CA 2025 imports
# it as v1 (the same types; upstream renamed the package), and two constants were added later.
mkdir -p "$SRC/ca"
install -m 0644 "$WRAPPERS/ca/go.mod" "$WRAPPERS/ca/tools.go" "$SRC/ca/"
rm -rf "$SRC/ca/go.sum" "$SRC/ca/apis-shim"
cd "$SRC/ca"
APIS_DIR=$(module_dir "k8s.io/autoscaler/cluster-autoscaler/apis@$CA_APIS_VERSION")
[ -n "$APIS_DIR" ] || { log "could not download k8s.io/autoscaler/cluster-autoscaler/apis@$CA_APIS_VERSION"; exit 1; }
cp -R "$APIS_DIR" apis-shim
chmod -R u+w apis-shim
find apis-shim -depth -type d -name v1beta1 -execdir mv v1beta1 v1 \;
# Package clause, import paths and version strings become v1; exported names (AutoscalingV1beta1)
# lose the suffix; the package's import alias `v1beta1` becomes `provreqv1`, not `v1`, which
# would clash with the `v1` alias of k8s.io/apimachinery/pkg/apis/meta/v1 in the same files.
find apis-shim -type f -name '*.go' -exec sed -i -e 's/^package v1beta1$/package v1/' \
  -e 's#/v1beta1\([/"]\)#/v1\1#g' -e 's/"v1beta1"/"v1"/g' -e 's/V1beta1/V1/g' \
  -e 's/autoscalingxk8siov1beta1/autoscalingxk8siov1/g' -e 's/\bv1beta1\b/provreqv1/g' {} +
install -m 0644 "$WRAPPERS/ca/apis_shim_constants.go" \
  apis-shim/provisioningrequest/autoscaling.x-k8s.io/v1/zz_fracpilot_shim_constants.go
step "resolved cluster-autoscaler modules (go mod tidy)" go mod tidy
# -tags kwok: CA's cloudprovider/builder compiles in only the kwok provider.
step "built cluster-autoscaler (kwok provider)" \
  go build -trimpath -tags kwok -ldflags "-s -w" -o "$BIN/cluster-autoscaler" k8s.io/autoscaler/cluster-autoscaler

# --- kube-scheduler, kube-controller-manager: the apiserver's wrapper go.mod (k8s-testbin.sh)
# in a copy, with its tags and version stamps, so `--version` says the same and the build
# reuses the apiserver's compiled packages.
mkdir -p "$SRC/k8s"
install -m 0644 "$K8S_SRC/go.mod" "$K8S_SRC/go.sum" "$SRC/k8s/"
cd "$SRC/k8s"
MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
KK_TIME=$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "k8s.io/kubernetes@$K8S_VERSION")
kv_ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR"
  kv_ldflags+=" -X $p.gitCommit= -X $p.gitTreeState=archive -X $p.buildDate=$KK_TIME"
done
for c in kube-scheduler kube-controller-manager; do
  step "built $c $K8S_VERSION" go build -trimpath -tags selinux,notest,grpcnotrace \
    -ldflags "-s -w$kv_ldflags" -o "$BIN/$c" "k8s.io/kubernetes/cmd/$c"
done

{ stamp_text; printf 'go=%s\n' "$(go env GOVERSION)"; } >"$STAMP"
up_to_date || { log "built binaries are incomplete or report unexpected versions:"; ls -l "$BIN" >&2; \
  "$BIN/kube-scheduler" --version >&2 || true; exit 1; }
log "done in $(since "$T0")"
echo "$BIN"
