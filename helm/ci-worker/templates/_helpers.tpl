{{/* Names and labels shared by every template. */}}

{{- define "ci-worker.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* release-chart, or the release name when it already says ci-worker. */}}
{{- define "ci-worker.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ci-worker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ci-worker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ci-worker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "ci-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The worker config: values.config, with the paths of mounted credentials. */}}
{{- define "ci-worker.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $nats := default dict $cfg.nats -}}
{{- if and .Values.natsAuth.existingSecret .Values.natsAuth.credsKey -}}
{{- $_ := set $nats "creds_file" "/etc/ci-nats/creds" -}}
{{- end -}}
{{- if and .Values.natsAuth.existingSecret .Values.natsAuth.nkeySeedKey -}}
{{- $_ := set $nats "nkey_seed_file" "/etc/ci-nats/nkey" -}}
{{- end -}}
{{- $_ := set $cfg "nats" $nats -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* host:port of the NATS monitoring endpoint for KEDA. */}}
{{- define "ci-worker.natsMonitoring" -}}
{{- if .Values.keda.natsServerMonitoringEndpoint -}}
{{- .Values.keda.natsServerMonitoringEndpoint -}}
{{- else if .Values.nats.enabled -}}
{{- printf "%s-nats-headless.%s.svc.cluster.local:8222" .Release.Name .Release.Namespace -}}
{{- else -}}
{{- fail "keda.enabled needs keda.natsServerMonitoringEndpoint (host:port of the NATS monitoring endpoint), or nats.enabled" -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount the pods run as: serviceAccount.name, else the full
name when the chart creates one, else the namespace's "default". */}}
{{- define "ci-worker.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else if .Values.serviceAccount.create -}}
{{- include "ci-worker.fullname" . -}}
{{- else -}}
default
{{- end -}}
{{- end -}}

{{/* "true" when the workers send tasks to ci-executor (worker.provider
cloudrun): they run no task code, so they get the runtime's default
confinement instead of what the local sandbox needs. */}}
{{- define "ci-worker.cloudrun" -}}
{{- if eq (toString (dig "worker" "provider" "local" .Values.config)) "cloudrun" -}}
true
{{- end -}}
{{- end -}}
