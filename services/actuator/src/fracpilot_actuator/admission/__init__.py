"""The admission webhook's pure core: an AdmissionReview and the targets in, a JSONPatch out.

- :mod:`.review`: parse the AdmissionReview, answer it (:func:`admit`);
- :mod:`.pods`: read a pod (opt-out, its workload);
- :mod:`.sizing`: the ops that give a pod or a pod template its target (KAI, HAMi), and
  the memory flag of an LLM server that preallocates (vLLM, SGLang, TGI);
- :mod:`.json_patch`: JSON Pointers and the patch builder;
- :mod:`.configuration`: the MutatingWebhookConfiguration.

No I/O here (the HTTPS server is :mod:`fracpilot_actuator.webhook`): :func:`admit` answers an
``admission.k8s.io/v1`` AdmissionReview for a Pod CREATE from the targets map, and never
denies; :func:`webhook_configuration` builds the MutatingWebhookConfiguration that registers it,
with ``failurePolicy: Ignore`` so that the webhook being down never blocks pod creation.

Which workload a pod belongs to comes from its controller owner reference: a ReplicaSet named
``<deployment>-<pod-template-hash>`` (the pod's ``pod-template-hash`` label) stands for its
Deployment; StatefulSets, DaemonSets and Jobs are used directly (a Job whose name ends in a
CronJob's scheduled-time suffix is also looked up as that CronJob, as ingest names it); a
pod without an owner has no workload.
"""

from __future__ import annotations

from fracpilot_actuator.admission.configuration import (
    MUTATE_PATH,
    WEBHOOK_CONFIGURATION_NAME,
    WEBHOOK_NAME,
    ServiceReference,
    webhook_configuration,
)
from fracpilot_actuator.admission.json_patch import (
    PatchBuilder,
    Token,
    escape_token,
    pointer,
)
from fracpilot_actuator.admission.pods import (
    OPT_OUT,
    POD_TEMPLATE_HASH,
    TARGET_ANNOTATION,
    opted_out,
    pod_name,
    workload_candidates,
)
from fracpilot_actuator.admission.review import (
    ADMISSION_API_VERSION,
    LLM_FLAG_ABOVE_FRACTION,
    Admission,
    AdmissionOutcome,
    MalformedReviewError,
    admit,
    parse_review,
    review_response,
)
from fracpilot_actuator.admission.sizing import (
    GPU,
    HAMI_CORES,
    HAMI_MEMORY,
    HAMI_MEMORY_PERCENT,
    KAI_CONTAINER,
    KAI_FRACTION,
    KAI_MEMORY,
    KAI_MPS,
    KAI_NUM_DEVICES,
    KAI_SCHEDULER,
    Sizing,
    format_fraction,
    percent,
    sizing_patch,
    template_patch,
    visible_share,
)

__all__ = [
    "ADMISSION_API_VERSION",
    "GPU",
    "HAMI_CORES",
    "HAMI_MEMORY",
    "HAMI_MEMORY_PERCENT",
    "KAI_CONTAINER",
    "KAI_FRACTION",
    "KAI_MEMORY",
    "KAI_MPS",
    "KAI_NUM_DEVICES",
    "KAI_SCHEDULER",
    "LLM_FLAG_ABOVE_FRACTION",
    "MUTATE_PATH",
    "OPT_OUT",
    "POD_TEMPLATE_HASH",
    "TARGET_ANNOTATION",
    "WEBHOOK_CONFIGURATION_NAME",
    "WEBHOOK_NAME",
    "Admission",
    "AdmissionOutcome",
    "MalformedReviewError",
    "PatchBuilder",
    "ServiceReference",
    "Sizing",
    "Token",
    "admit",
    "escape_token",
    "format_fraction",
    "opted_out",
    "parse_review",
    "percent",
    "pod_name",
    "pointer",
    "review_response",
    "sizing_patch",
    "template_patch",
    "visible_share",
    "webhook_configuration",
    "workload_candidates",
]
