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
{{- if $image.digest -}}
{{- printf "%s:%s@%s" $image.repository $image.tag $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $image.tag -}}
{{- end -}}
{{- end -}}

{{/* nats.conf. $POD_NAME, $NATS_USER and $NATS_PASSWORD come from the container's
environment. */}}
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
