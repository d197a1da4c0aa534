{{/* The built-in NATS (nats.deploy): its configuration and names. nats.yaml uses them.

The shape of the cluster follows the official NATS chart (nats-io/k8s helm/charts/nats,
files/config/config.yaml and files/config/cluster.yaml): server_name is the pod's name, the
cluster is named after the StatefulSet, and the routes name every pod through the headless
Service (a server skips the route to itself). */}}

{{/* The StatefulSet's (and the pods' name prefix) and the headless Service's names. */}}
{{- define "fracpilot.natsName" -}}
{{- include "fracpilot.componentName" (list . "nats") -}}
{{- end -}}
{{- define "fracpilot.natsHeadlessName" -}}
{{- printf "%s-headless" (include "fracpilot.natsName" .) -}}
{{- end -}}

{{/* true when the built-in NATS runs more than one server: a cluster block and routes. */}}
{{- define "fracpilot.natsClustered" -}}
{{- if gt (int .Values.nats.replicas) 1 -}}true{{- end -}}
{{- end -}}

{{/* The route URL of every server: its pod's DNS name under the headless Service. */}}
{{- define "fracpilot.natsRoutes" -}}
{{- $name := include "fracpilot.natsName" . -}}
{{- $headless := include "fracpilot.natsHeadlessName" . -}}
{{- range $i := until (int .Values.nats.replicas) }}
{{ printf "nats://%s-%d.%s.%s.svc:%d" $name $i $headless $.Release.Namespace (int $.Values.nats.cluster.port) }}
{{- end -}}
{{- end -}}

{{/* The replicas the services give every stream and KV bucket (FRACPILOT_NATS_REPLICAS):
nats.streamReplicas, else with the built-in NATS 3 on 3 or more servers and 1 on fewer;
empty (the services detect it from the server) for your own NATS. */}}
{{- define "fracpilot.natsStreamReplicas" -}}
{{- if .Values.nats.streamReplicas -}}
{{- .Values.nats.streamReplicas -}}
{{- else if .Values.nats.deploy -}}
{{- ternary 3 1 (ge (int .Values.nats.replicas) 3) -}}
{{- end -}}
{{- end -}}

{{/* The streams' limits (nats.streams) as the services' FRACPILOT_STREAMS_* (and
FRACPILOT_USAGE_MAX_AGE_S); a 0 is left out: no limit, or the service's default. */}}
{{- define "fracpilot.streamLimitsEnv" -}}
{{- $s := .Values.nats.streams -}}
{{- $env := dict
  "FRACPILOT_USAGE_MAX_AGE_S" $s.usage.maxAgeSeconds
  "FRACPILOT_STREAMS_USAGE_MAX_BYTES" $s.usage.maxBytes
  "FRACPILOT_STREAMS_DECISIONS_MAX_BYTES" $s.decisions.maxBytes
  "FRACPILOT_STREAMS_DECISIONS_MAX_AGE_S" $s.decisions.maxAgeSeconds
  "FRACPILOT_STREAMS_RESULTS_MAX_BYTES" $s.results.maxBytes
  "FRACPILOT_STREAMS_RESULTS_MAX_AGE_S" $s.results.maxAgeSeconds
  "FRACPILOT_STREAMS_DEADLETTERS_MAX_BYTES" $s.deadLetters.maxBytes
  "FRACPILOT_STREAMS_DEADLETTERS_MAX_AGE_S" $s.deadLetters.maxAgeSeconds
-}}
{{- range $name := keys $env | sortAlpha }}
{{- $value := index $env $name }}
{{- if $value }}
- name: {{ $name }}
  value: {{ int64 $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The prometheus-nats-exporter sidecar's image. */}}
{{- define "fracpilot.natsExporterImage" -}}
{{- $image := .Values.nats.metrics.image -}}
{{- include "fracpilot.imageRef" (list . $image.repository $image.tag $image.digest) -}}
{{- end -}}

{{/* The NATS identities, one per component (deploy/nats/permissions.conf names their
permissions <IDENTITY>_PERMISSIONS). */}}
{{- define "fracpilot.natsIdentityNames" -}}
{{- toJson (list "ingest" "decision" "actuator" "operator" "policy-admin") -}}
{{- end -}}

{{/* true when the services use one identity each (nats.auth.type identities). */}}
{{- define "fracpilot.natsIdentities" -}}
{{- if eq .Values.nats.auth.type "identities" -}}true{{- end -}}
{{- end -}}

{{/* (list $ "policy-admin"): the Secret with that identity's user and password: yours
(nats.auth.identities.<identity>) or the chart's <fullname>-nats-<identity>. */}}
{{- define "fracpilot.natsIdentitySecretName" -}}
{{- $ := index . 0 -}}
{{- $identity := index . 1 -}}
{{- $given := index $.Values.nats.auth.identities ($identity | replace "-admin" "Admin") -}}
{{- $given | default (printf "%s-nats-%s" (include "fracpilot.fullname" $) $identity) -}}
{{- end -}}

{{/* (list $ "policy-admin"): true when the chart makes that identity's Secret itself (render
time or hook). */}}
{{- define "fracpilot.natsIdentityGenerated" -}}
{{- $ := index . 0 -}}
{{- $identity := index . 1 -}}
{{- if and (include "fracpilot.natsIdentities" $) (not (index $.Values.nats.auth.identities ($identity | replace "-admin" "Admin"))) -}}true{{- end -}}
{{- end -}}

{{/* The server's environment variable holding an identity's user or password:
(list "policy-admin" "PASSWORD") -> FRACPILOT_NATS_POLICY_ADMIN_PASSWORD (the names
deploy/nats/nats-server.conf uses). */}}
{{- define "fracpilot.natsIdentityVariable" -}}
{{- printf "FRACPILOT_NATS_%s_%s" (index . 0 | upper | replace "-" "_") (index . 1) -}}
{{- end -}}

{{/* TLS on the built-in NATS (nats.deploy and nats.tls.enabled). */}}
{{- define "fracpilot.natsBuiltinTls" -}}
{{- if and .Values.nats.deploy .Values.nats.tls.enabled -}}true{{- end -}}
{{- end -}}

{{/* The built-in server's certificate Secret (tls.crt, tls.key, ca.crt): yours or the chart's. */}}
{{- define "fracpilot.natsServerTlsSecretName" -}}
{{- .Values.nats.tls.existingSecret | default (printf "%s-nats-tls" (include "fracpilot.fullname" .)) -}}
{{- end -}}

{{/* true when cert-manager issues the built-in NATS's certificate: asked for
(nats.tls.certManager.enabled), its API served, and no Secret of yours. */}}
{{- define "fracpilot.natsCertManager" -}}
{{- $tls := .Values.nats.tls -}}
{{- if and (include "fracpilot.natsBuiltinTls" .) $tls.certManager.enabled (not $tls.existingSecret) (.Capabilities.APIVersions.Has "cert-manager.io/v1/Certificate") -}}true{{- end -}}
{{- end -}}

{{/* true when the chart makes the built-in NATS's CA and certificate itself (helm at render
time, or the release-secrets hook): neither a Secret of yours nor cert-manager. */}}
{{- define "fracpilot.natsChartMadeTls" -}}
{{- if and (include "fracpilot.natsBuiltinTls" .) (not .Values.nats.tls.existingSecret) (not (include "fracpilot.natsCertManager" .)) -}}true{{- end -}}
{{- end -}}

{{/* The Secret the clients read the CA from: the chart's CA-only Secret when it makes the
certificate (so that reading the CA never gives the server's key); with cert-manager its
Secret (the pods mount its ca.crt alone; cert-manager keeps it current on renewal); else
nats.tls.existingSecret. */}}
{{- define "fracpilot.natsClientCaSecretName" -}}
{{- if include "fracpilot.natsChartMadeTls" . -}}
{{- printf "%s-nats-ca" (include "fracpilot.fullname" .) -}}
{{- else if include "fracpilot.natsCertManager" . -}}
{{- include "fracpilot.natsServerTlsSecretName" . -}}
{{- else -}}
{{- .Values.nats.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* true when the config reloader sidecar runs beside the built-in server
(nats.reloader.enabled; auto: when its certificate can change under it). */}}
{{- define "fracpilot.natsReloader" -}}
{{- $enabled := .Values.nats.reloader.enabled -}}
{{- if eq (toString $enabled) "auto" -}}
{{- if and (include "fracpilot.natsBuiltinTls" .) (or (include "fracpilot.natsCertManager" .) .Values.nats.tls.existingSecret) -}}true{{- end -}}
{{- else if $enabled -}}true
{{- end -}}
{{- end -}}

{{/* The config reloader's image. */}}
{{- define "fracpilot.natsReloaderImage" -}}
{{- $image := .Values.nats.reloader.image -}}
{{- include "fracpilot.imageRef" (list . $image.repository $image.tag $image.digest) -}}
{{- end -}}

{{/* true when the clients mount a CA (nats-tls volume) and set FRACPILOT_NATS_TLS_CA_FILE. */}}
{{- define "fracpilot.natsClientTls" -}}
{{- if .Values.nats.tls.enabled -}}
{{- if include "fracpilot.natsBuiltinTls" . -}}true
{{- else if .Values.nats.tls.existingSecret -}}true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The names the built-in server's certificate covers: the client Service (as the services'
URL spells it), every pod under the headless Service (routes), and loopback (kubectl
port-forward: the CLI connects to 127.0.0.1). JSON list. */}}
{{- define "fracpilot.natsTlsDnsNames" -}}
{{- $name := include "fracpilot.natsName" . -}}
{{- $headless := include "fracpilot.natsHeadlessName" . -}}
{{- $ns := .Release.Namespace -}}
{{- toJson (list
  (printf "%s.%s.svc" $name $ns)
  (printf "%s.%s.svc.cluster.local" $name $ns)
  (printf "%s.%s" $name $ns)
  $name
  (printf "*.%s.%s.svc" $headless $ns)
  (printf "*.%s.%s.svc.cluster.local" $headless $ns)
  "localhost") -}}
{{- end -}}

{{/* nats.conf. $POD_NAME and the identities' users and passwords come from the container's
environment; permissions.conf is files/nats/permissions.conf, a copy of
deploy/nats/permissions.conf (tests/unit/deploy/test_chart_files.py keeps them equal), in the
same ConfigMap. */}}
{{- define "fracpilot.natsConfig" -}}
server_name: $POD_NAME
port: 4222
http_port: 8222
pid_file: /var/run/nats/nats.pid
lame_duck_duration: 30s
lame_duck_grace_period: 10s
jetstream {
  store_dir: /data
  # Per server: each holds one replica of every R3 stream.
  max_memory_store: {{ .Values.nats.jetstream.maxMemoryStore }}
  max_file_store: {{ .Values.nats.jetstream.maxFileStore }}
}
{{- if include "fracpilot.natsClustered" . }}
cluster {
  name: {{ .Values.nats.cluster.name | default (include "fracpilot.natsName" .) }}
  port: {{ .Values.nats.cluster.port }}
  # Clients reach the servers through the Service, not pod addresses gossiped to them.
  no_advertise: true
  routes: [
    {{- include "fracpilot.natsRoutes" . | trim | nindent 4 }}
  ]
  {{- if include "fracpilot.natsBuiltinTls" . }}
  # Routes are mutual TLS: only a server with a certificate of this CA joins the cluster.
  tls {
    cert_file: /etc/nats-tls/tls.crt
    key_file: /etc/nats-tls/tls.key
    ca_file: /etc/nats-tls/ca.crt
    verify: true
    timeout: 2
  }
  {{- end }}
}
{{- end }}
{{- if include "fracpilot.natsBuiltinTls" . }}
# Clients must speak TLS (a plain-text connection is refused) and verify this certificate.
tls {
  cert_file: /etc/nats-tls/tls.crt
  key_file: /etc/nats-tls/tls.key
  ca_file: /etc/nats-tls/ca.crt
  timeout: 2
}
{{- end }}
{{- if include "fracpilot.natsIdentities" . }}
# One identity per component, each with the permissions of deploy/nats/permissions.conf
# (everything else is denied); a connection without one of them is refused.
include permissions.conf

accounts {
  FRACPILOT {
    jetstream: enabled
    users: [
      {{- range $identity := include "fracpilot.natsIdentityNames" . | fromJsonArray }}
      { user: ${{ include "fracpilot.natsIdentityVariable" (list $identity "USER") }}, password: ${{ include "fracpilot.natsIdentityVariable" (list $identity "PASSWORD") }}, permissions: ${{ $identity | upper | replace "-" "_" }}_PERMISSIONS }
      {{- end }}
    ]
  }
}
{{- end }}
{{- if eq .Values.nats.auth.type "userPassword" }}
# $NATS_USER and $NATS_PASSWORD come from the Secret, through the environment.
authorization {
  user: $NATS_USER
  password: $NATS_PASSWORD
}
{{- end }}
{{- end -}}
