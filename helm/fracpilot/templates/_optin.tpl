{{/* The opt-in rule (services/actuator/src/fracpilot_actuator/opt_in.py), from one value:
     optIn.defaultMode. The actuator reads it as FRACPILOT_OPTIN_DEFAULT_MODE, and the webhook's
     two selectors below are webhook_selectors() of that module, so the apiserver sends the
     webhook exactly the pods the actuator would resize (tests/integration/k8s/test_helm_chart.py
     compares the rendered selectors with the module's). */}}

{{/* Namespaces never changed: webhook.excludedNamespaces and the release's own, sorted. */}}
{{- define "fracpilot.optIn.excludedNamespaces" -}}
{{- toJson (sortAlpha (uniq (append .Values.webhook.excludedNamespaces .Release.Namespace))) -}}
{{- end -}}

{{/* The two webhooks' selectors, as a JSON list of {prefix, namespace, pod} matchExpressions:
     the pods of namespaces whose mode is auto (unless the pod says recommend or off), and pods
     labelled fracpilot.io/mode=auto in the other namespaces. */}}
{{- define "fracpilot.optIn.webhookSelectors" -}}
{{- $excluded := include "fracpilot.optIn.excludedNamespaces" . | fromJsonArray -}}
{{- $byName := dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded -}}
{{- $notOut := dict "key" "fracpilot.io/opt-out" "operator" "NotIn" "values" (list "true") -}}
{{- $autoNs := dict "key" "fracpilot.io/mode" "operator" "In" "values" (list "auto") -}}
{{- $otherNs := dict "key" "fracpilot.io/mode" "operator" "NotIn" "values" (list "auto") -}}
{{- if eq .Values.optIn.defaultMode "auto" -}}
{{- $autoNs = dict "key" "fracpilot.io/mode" "operator" "NotIn" "values" (list "off" "recommend") -}}
{{- $otherNs = dict "key" "fracpilot.io/mode" "operator" "In" "values" (list "off" "recommend") -}}
{{- end -}}
{{- $podInherits := dict "key" "fracpilot.io/mode" "operator" "NotIn" "values" (list "off" "recommend") -}}
{{- $podAuto := dict "key" "fracpilot.io/mode" "operator" "In" "values" (list "auto") -}}
{{- toJson (list
      (dict "prefix" "" "namespace" (list $byName $autoNs $notOut) "pod" (list $podInherits $notOut))
      (dict "prefix" "pods." "namespace" (list $byName $otherNs $notOut) "pod" (list $podAuto $notOut))) -}}
{{- end -}}
