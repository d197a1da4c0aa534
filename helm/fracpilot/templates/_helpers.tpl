{{/* Names ---------------------------------------------------------------------------------- */}}

{{- define "fracpilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: the release name when it says fracpilot already. */}}
{{- define "fracpilot.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's name: (list $ "actuator") */}}
{{- define "fracpilot.componentName" -}}
{{- printf "%s-%s" (include "fracpilot.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{/* The ServiceAccount a component's pods run as, and its RBAC bindings name: the chart's
     (serviceAccount.create) or yours, by serviceAccount.name. (list $ "actuator") */}}
{{- define "fracpilot.serviceAccountName" -}}
{{- $ := index . 0 -}}
{{- $account := (index $.Values (index . 1)).serviceAccount -}}
{{- if $account.create -}}
{{- $account.name | default (include "fracpilot.componentName" .) -}}
{{- else -}}
{{- required (printf "%s.serviceAccount.name is required when %s.serviceAccount.create is false" (index . 1) (index . 1)) $account.name -}}
{{- end -}}
{{- end -}}

{{/* "true" when a component calls the Kubernetes API (and so needs a token). (list $ "ingest") */}}
{{- define "fracpilot.usesKubernetesApi" -}}
{{- $ := index . 0 -}}
{{- $component := index . 1 -}}
{{- or (eq $component "actuator") (and (eq $component "ingest") (eq $.Values.ingest.owners "kubernetes")) -}}
{{- end -}}

{{- define "fracpilot.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "fracpilot.fullname" .) -}}
{{- end -}}

{{- define "fracpilot.natsAuthSecretName" -}}
{{- .Values.nats.auth.existingSecret | default (printf "%s-nats-auth" (include "fracpilot.fullname" .)) -}}
{{- end -}}

{{/* Labels ---------------------------------------------------------------------------------- */}}

{{- define "fracpilot.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "fracpilot.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* (list $ "component") */}}
{{- define "fracpilot.labels" -}}
{{- $ := index . 0 -}}
{{ include "fracpilot.selectorLabels" . }}
app.kubernetes.io/part-of: fracpilot
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Images ---------------------------------------------------------------------------------- */}}

{{/* An image repository with global.imageRegistry in front: a registry host the repository
     names (a first part with a "." or ":", or localhost, as docker tells a host from a path) is
     replaced by it, the rest of the path kept, as charts with a global.imageRegistry do (a
     mirror holding every image under its upstream path). (list $ "ghcr.io/fracpilot/x") */}}
{{- define "fracpilot.registryRepository" -}}
{{- $ := index . 0 -}}
{{- $repository := index . 1 -}}
{{- $mirror := (($.Values.global).imageRegistry) | default "" | trimSuffix "/" -}}
{{- if not $mirror -}}
{{- $repository -}}
{{- else -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $parts = rest $parts -}}
{{- end -}}
{{- printf "%s/%s" $mirror (join "/" $parts) -}}
{{- end -}}
{{- end -}}

{{/* repository:tag[@digest], through global.imageRegistry. (list $ repository tag digest) */}}
{{- define "fracpilot.imageRef" -}}
{{- $repository := include "fracpilot.registryRepository" (list (index . 0) (index . 1)) -}}
{{- $tag := index . 2 -}}
{{- $digest := index . 3 | default "" -}}
{{- if $digest -}}
{{- /* The digest pins the content; the tag stays for people reading the manifest. */ -}}
{{- printf "%s:%s@%s" $repository $tag $digest -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{/* A fracpilot image. (list $ "actuator") */}}
{{- define "fracpilot.image" -}}
{{- $ := index . 0 -}}
{{- $component := index . 1 -}}
{{- $values := index $.Values $component -}}
{{- $repository := $values.image.repository | default (printf "%s/fracpilot-%s" $.Values.image.registry $component) -}}
{{- $tag := $values.image.tag | default $.Values.image.tag | default $.Chart.AppVersion -}}
{{- include "fracpilot.imageRef" (list $ $repository $tag $values.image.digest) -}}
{{- end -}}

{{/* The built-in NATS server's image, with its digest when one is set. */}}
{{- define "fracpilot.natsImage" -}}
{{- $image := .Values.nats.image -}}
{{- include "fracpilot.imageRef" (list . $image.repository $image.tag $image.digest) -}}
{{- end -}}

{{/* The scale-up placeholder pods' image (a whole reference: repository:tag[@digest]). */}}
{{- define "fracpilot.placeholderImage" -}}
{{- include "fracpilot.registryRepository" (list . .Values.actuator.placeholderImage) -}}
{{- end -}}

{{/* Capabilities ---------------------------------------------------------------------------- */}}

{{/* "true" when cert-manager issues the webhook certificate (asked for, and its API is there). */}}
{{- define "fracpilot.useCertManager" -}}
{{- if and .Values.webhook.enabled .Values.webhook.certManager.enabled (.Capabilities.APIVersions.Has "cert-manager.io/v1/Certificate") -}}
true
{{- end -}}
{{- end -}}

{{/* The NATS URL the services use. */}}
{{- define "fracpilot.natsUrl" -}}
{{- if .Values.nats.deploy -}}
{{- printf "nats://%s.%s.svc:4222" (include "fracpilot.componentName" (list . "nats")) .Release.Namespace -}}
{{- else -}}
{{- required "nats.url is required when nats.deploy is false" .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{/* RBAC rules ------------------------------------------------------------------------------ */}}

{{/* The rules of one kind (ClusterRole or Role) in files/rbac/<file>, a copy of deploy/rbac/
     (`make chart-sync`; tests/unit/deploy/test_chart_files.py fails when it differs): the chart
     grants exactly what that file, tested against a real apiserver, grants.
     (list $ "actuator.yaml" "ClusterRole") */}}
{{- define "fracpilot.rbacRules" -}}
{{- $ := index . 0 -}}
{{- $path := printf "files/rbac/%s" (index . 1) -}}
{{- $kind := index . 2 -}}
{{- $content := $.Files.Get $path -}}
{{- if not $content -}}
{{- fail (printf "%s is missing from the chart (a copy of deploy/rbac/: make chart-sync)" $path) -}}
{{- end -}}
{{- $found := list -}}
{{- range regexSplit "(?m)^---[ \\t]*$" $content -1 -}}
{{- $doc := fromYaml . -}}
{{- if and $doc (eq (get $doc "kind" | toString) $kind) -}}
{{- $found = append $found $doc.rules -}}
{{- end -}}
{{- end -}}
{{- if ne (len $found) 1 -}}
{{- fail (printf "%s has %d %s objects, expected 1" $path (len $found) $kind) -}}
{{- end -}}
{{- toYaml (first $found) -}}
{{- end -}}

{{/* Pods ------------------------------------------------------------------------------------ */}}

{{/* The environment every service shares: NATS, telemetry, cost model. (list $ "decision"):
with nats.auth.type identities, that identity's user and password (the release checks pass
"operator" or "policy-admin"). */}}
{{- define "fracpilot.commonEnv" -}}
{{- $identity := "" -}}
{{- $context := . -}}
{{- if kindIs "slice" . -}}
{{- $context = index . 0 -}}
{{- $identity = index . 1 -}}
{{- end -}}
{{- with $context -}}
- name: FRACPILOT_NATS_URL
  value: {{ include "fracpilot.natsUrl" . | quote }}
{{- with include "fracpilot.natsStreamReplicas" . }}
- name: FRACPILOT_NATS_REPLICAS
  value: {{ . | quote }}
{{- end }}
{{- include "fracpilot.streamLimitsEnv" . }}
{{- $auth := .Values.nats.auth }}
{{- if include "fracpilot.natsIdentities" . }}
{{- $secret := include "fracpilot.natsIdentitySecretName" (list . (required "fracpilot.commonEnv needs the component's identity" $identity)) }}
- name: FRACPILOT_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $auth.userKey }}
- name: FRACPILOT_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $auth.passwordKey }}
{{- else if eq $auth.type "userPassword" }}
- name: FRACPILOT_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ include "fracpilot.natsAuthSecretName" . }}
      key: {{ $auth.userKey }}
- name: FRACPILOT_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "fracpilot.natsAuthSecretName" . }}
      key: {{ $auth.passwordKey }}
{{- else if eq $auth.type "nkey" }}
- name: FRACPILOT_NATS_NKEY_SEED_FILE
  value: /etc/fracpilot/nats/auth/nkey.seed
{{- else if eq $auth.type "creds" }}
- name: FRACPILOT_NATS_CREDS_FILE
  value: /etc/fracpilot/nats/auth/nats.creds
{{- end }}
{{- if include "fracpilot.natsClientTls" . }}
{{- if or (include "fracpilot.natsBuiltinTls" .) .Values.nats.tls.caKey }}
- name: FRACPILOT_NATS_TLS_CA_FILE
  value: /etc/fracpilot/nats/tls/ca.crt
{{- end }}
{{- if and (not .Values.nats.deploy) .Values.nats.tls.clientCert }}
- name: FRACPILOT_NATS_TLS_CERT_FILE
  value: /etc/fracpilot/nats/tls/tls.crt
- name: FRACPILOT_NATS_TLS_KEY_FILE
  value: /etc/fracpilot/nats/tls/tls.key
{{- end }}
{{- end }}
- name: FRACPILOT_METRICS_HOST
  value: "0.0.0.0"
- name: FRACPILOT_METRICS_PORT
  value: {{ .Values.metricsPort | quote }}
- name: FRACPILOT_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- with .Values.otlpEndpoint }}
- name: FRACPILOT_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.pricing.gpuPrices }}
- name: FRACPILOT_GPU_PRICES
  value: {{ toJson . | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.pricing.defaultPrice) }}
- name: FRACPILOT_GPU_DEFAULT_PRICE
  value: {{ .Values.pricing.defaultPrice | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Volumes for NATS credentials and TLS files, and /tmp (the root filesystem is read-only). */}}
{{- define "fracpilot.commonVolumes" -}}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- $auth := .Values.nats.auth }}
{{- if has $auth.type (list "nkey" "creds") }}
- name: nats-auth
  secret:
    secretName: {{ $auth.existingSecret }}
    defaultMode: 0440
    items:
      {{- if eq $auth.type "nkey" }}
      - key: {{ $auth.nkeySeedKey }}
        path: nkey.seed
      {{- else }}
      - key: {{ $auth.credsKey }}
        path: nats.creds
      {{- end }}
{{- end }}
{{- $tls := .Values.nats.tls }}
{{- if include "fracpilot.natsClientTls" . }}
{{- $builtinCa := and (include "fracpilot.natsBuiltinTls" .) (not $tls.existingSecret) }}
- name: nats-tls
  secret:
    secretName: {{ include "fracpilot.natsClientCaSecretName" . }}
    defaultMode: 0440
    items:
      {{- if $builtinCa }}
      - key: ca.crt
        path: ca.crt
      {{- else if $tls.caKey }}
      - key: {{ $tls.caKey }}
        path: ca.crt
      {{- end }}
      {{- if and (not .Values.nats.deploy) $tls.clientCert }}
      - key: {{ $tls.certKey }}
        path: tls.crt
      - key: {{ $tls.keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end -}}

{{- define "fracpilot.commonVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if has .Values.nats.auth.type (list "nkey" "creds") }}
- name: nats-auth
  mountPath: /etc/fracpilot/nats/auth
  readOnly: true
{{- end }}
{{- if include "fracpilot.natsClientTls" . }}
- name: nats-tls
  mountPath: /etc/fracpilot/nats/tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Probes on the telemetry port. */}}
{{- define "fracpilot.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* What every fracpilot pod spec shares. (list $ "component") */}}
{{- define "fracpilot.podCommon" -}}
{{- $ := index . 0 -}}
{{- $values := index $.Values (index . 1) -}}
serviceAccountName: {{ include "fracpilot.serviceAccountName" . }}
# On the pod as well as on the ServiceAccount: a ServiceAccount of yours
# (serviceAccount.create false) may mount a token by default.
automountServiceAccountToken: {{ include "fracpilot.usesKubernetesApi" . }}
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
# Service links would put variables such as FRACPILOT_WEBHOOK_PORT=tcp://... into the
# environment, where the FRACPILOT_ settings are read from.
enableServiceLinks: false
securityContext:
  {{- toYaml $.Values.podSecurityContext | nindent 2 }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The built-in NATS server's configuration: _nats.tpl. */}}

{{/* The MutatingWebhookConfiguration's name. The apiserver calls mutating webhooks in the
     order of their configurations' names (k8s.io/apiserver pkg/admission/configuration/
     mutating_webhook_manager.go sorts them ByName), and ours must run before KAI-Scheduler's
     `mutating-kai-admission` (NVIDIA/KAI-scheduler pkg/apis/kai/v1/admission/admission.go):
     KAI adds env vars from a ConfigMap to fraction pods, and a pod we turn into a whole-GPU
     pod after that fails to start (CreateContainerConfigError). So the name always starts
     with "fracpilot" ("f" < "m"), whatever the release is called. */}}
{{- define "fracpilot.webhookConfigurationName" -}}
{{- $fullname := include "fracpilot.fullname" . -}}
{{- if hasPrefix "fracpilot" $fullname -}}
{{- printf "%s-targets" $fullname -}}
{{- else -}}
{{- printf "fracpilot-%s-targets" $fullname -}}
{{- end -}}
{{- end -}}
