{{/* What values.schema.json cannot say (relations between values), checked before anything is
     rendered: the decision service would refuse such a policy at start and crash-loop. */}}
{{- define "fracpilot.validate" -}}
{{- $p := .Values.policy -}}
{{- $grid := $p.grid | default "backend" -}}
{{- $steps := 100.0 -}}
{{- if eq $grid "steps" -}}{{- $steps = $p.grid_steps | default 8 | float64 -}}{{- end -}}
{{- $min := (hasKey $p "min_fraction") | ternary $p.min_fraction 0.1 | float64 -}}
{{- $max := (hasKey $p "max_fraction") | ternary $p.max_fraction 1.0 | float64 -}}
{{- if gt $min $max -}}
{{- fail (printf "policy.min_fraction %v is above policy.max_fraction %v" $min $max) -}}
{{- end -}}
{{- if ne $grid "levels" -}}
{{- range $name, $value := dict "min_fraction" $min "max_fraction" $max -}}
{{- $off := subf (mulf $value $steps) (round (mulf $value $steps) 0) -}}
{{- if or (gt $off 0.000000001) (lt $off -0.000000001) -}}
{{- fail (printf "policy.%s %v is not on the grid of 1/%v (policy.grid %s)" $name $value $steps $grid) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $e := .Values.actuator.leaderElection -}}
{{- if and .Values.actuator.enabled $e.enabled -}}
{{- if gt (float64 $e.renewDeadlineSeconds) (float64 $e.leaseDurationSeconds) -}}
{{- fail (printf "actuator.leaderElection.renewDeadlineSeconds %v must not exceed leaseDurationSeconds %v: two leaders could overlap" $e.renewDeadlineSeconds $e.leaseDurationSeconds) -}}
{{- end -}}
{{- if ge (float64 $e.renewPeriodSeconds) (float64 $e.renewDeadlineSeconds) -}}
{{- fail (printf "actuator.leaderElection.renewPeriodSeconds %v must be below renewDeadlineSeconds %v" $e.renewPeriodSeconds $e.renewDeadlineSeconds) -}}
{{- end -}}
{{- end -}}
{{- $i := .Values.ingest -}}
{{- if and $i.prometheus.ca.secretName $i.prometheus.ca.configMapName -}}
{{- fail (printf "ingest.prometheus.ca names both a Secret (%s) and a ConfigMap (%s): name one" $i.prometheus.ca.secretName $i.prometheus.ca.configMapName) -}}
{{- end -}}
{{- if and $i.enabled (gt (int $i.replicas) 1) (le (int $i.shards) 1) -}}
{{- fail (printf "ingest.replicas %v needs ingest.shards (it is %v): unsharded replicas would publish every sample each" $i.replicas $i.shards) -}}
{{- end -}}
{{- if and $i.enabled (gt (int $i.shards) 1) (ne (join "," $i.sources) "prometheus") -}}
{{- fail (printf "ingest.shards needs ingest.sources [prometheus] alone (it is %v)" $i.sources) -}}
{{- end -}}
{{- if and $i.enabled $i.hamiNodes (ne $i.owners "kubernetes") -}}
{{- fail (printf "ingest.hamiNodes needs ingest.owners kubernetes (it is %s): nodes are watched with the pods" $i.owners) -}}
{{- end -}}
{{- end -}}
