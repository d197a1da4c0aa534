package v1

// Added by fracpilot's scripts/gpu-stack-testbin.sh to the local copy of
// k8s.io/autoscaler/cluster-autoscaler/apis (v1beta1 renamed to v1): cluster-autoscaler at
// 1959f5f61f6c uses these two constants of the upstream v1 package, which the only apis version
// the module proxy serves (2024-06, v1beta1) does not have yet. Values from upstream
// cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go.
const (
	// ProvisioningRequestPodAnnotationKey is an annotation on a pod that points to the
	// ProvisioningRequest it consumes.
	ProvisioningRequestPodAnnotationKey = "autoscaling.x-k8s.io/consume-provisioning-request"
	// ProvisioningClassPodAnnotationKey is an annotation on a pod with the provisioning class name.
	ProvisioningClassPodAnnotationKey = "autoscaling.x-k8s.io/provisioning-class-name"
)
