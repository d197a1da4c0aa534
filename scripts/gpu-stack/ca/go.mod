// Wrapper module for scripts/gpu-stack-testbin.sh: builds cluster-autoscaler (kwok provider).
// The module proxy serves only this pseudo-version of cluster-autoscaler (the first with
// cloudprovider/kwok that it has); `go mod tidy` in the cache dir adds the indirect requirements.
module example.invalid/fracpilot/catestbin

go 1.24.0

require k8s.io/autoscaler/cluster-autoscaler v0.0.0-20250613073258-1959f5f61f6c

// A dependency's replace directives do not apply to the main module, so cluster-autoscaler's own
// are repeated here: it requires k8s.io/kubernetes v1.33.1, whose go.mod requires these staging
// modules at v0.0.0 (or old tags); each is pinned to its v0.33.1 twin, as CA's go.mod does.
replace (
	k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.33.1
	k8s.io/code-generator => k8s.io/code-generator v0.33.1
	k8s.io/cri-api => k8s.io/cri-api v0.33.1
	k8s.io/cri-client => k8s.io/cri-client v0.33.1
	k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.33.1
	k8s.io/kms => k8s.io/kms v0.33.1
	k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.33.1
	k8s.io/kubectl => k8s.io/kubectl v0.33.1
	k8s.io/mount-utils => k8s.io/mount-utils v0.33.1
)

// CA's `apis` is a nested module, so it is not in CA's zip, and the proxy serves one old version
// of it. The script builds ./apis-shim from that version (v1beta1 renamed to v1, as upstream did
// later, plus apis_shim_constants.go).
replace k8s.io/autoscaler/cluster-autoscaler/apis => ./apis-shim
