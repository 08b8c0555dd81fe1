{{- define "stepserve.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stepserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "stepserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stepserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "stepserve.labels" -}}
{{ include "stepserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The container port the probes use: the metrics listener's when there is one. */}}
{{- define "stepserve.probePort" -}}
{{- if gt (int .Values.service.metricsPort) 0 }}metrics{{ else }}http{{ end -}}
{{- end -}}

{{/* A probe's handler for "live" or "ready": grpc.health.v1 on the gRPC
port with probes.grpc (the services of those names), else the OIP health
endpoint over HTTP. */}}
{{- define "stepserve.probe" -}}
{{- $ := index . 0 -}}
{{- $what := index . 1 -}}
{{- if $.Values.probes.grpc -}}
{{- if not (gt (int $.Values.service.grpcPort) 0) -}}
{{- fail "probes.grpc needs service.grpcPort" -}}
{{- end -}}
grpc:
  port: {{ $.Values.service.grpcPort }}
  service: {{ $what }}
{{- else -}}
httpGet:
  path: /v2/health/{{ $what }}
  port: {{ include "stepserve.probePort" $ }}
{{- end -}}
{{- end -}}

{{/* The drain grace in seconds, from config.server.shutdown_grace ("30s"). */}}
{{- define "stepserve.graceSeconds" -}}
{{- $g := .Values.config.server.shutdown_grace | default "30s" | toString -}}
{{- if hasSuffix "m" $g -}}{{ mul (trimSuffix "m" $g | int) 60 }}{{- else -}}{{ trimSuffix "s" $g | int }}{{- end -}}
{{- end -}}

{{/* The endpoint picker's name: inferenceGateway.epp.name, or <fullname>-epp. */}}
{{- define "stepserve.eppName" -}}
{{- .Values.inferenceGateway.epp.name | default (printf "%s-epp" (include "stepserve.fullname" .) | trunc 63 | trimSuffix "-") -}}
{{- end -}}

{{- define "stepserve.eppSelectorLabels" -}}
app.kubernetes.io/name: {{ include "stepserve.name" . }}-epp
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The picker's objects' labels: its own name, so that selectors of the
server's (the ServiceMonitor's) do not take them. */}}
{{- define "stepserve.eppLabels" -}}
{{ include "stepserve.eppSelectorLabels" . }}
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/part-of: {{ include "stepserve.name" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* autoscaling.signals as a JSON list of {name, target}: each signal
once, known, with its target per replica. */}}
{{- define "stepserve.signals" -}}
{{- $a := .Values.autoscaling -}}
{{- $targets := dict "queueDepth" $a.targetQueueDepth "requestsWaiting" $a.targetRequestsWaiting "kvCacheUsage" $a.targetKVCacheUsage -}}
{{- if not $a.signals -}}
{{- fail "autoscaling.signals is empty: name queueDepth, requestsWaiting or kvCacheUsage" -}}
{{- end -}}
{{- $out := list -}}
{{- range uniq $a.signals -}}
{{- if not (hasKey $targets .) -}}
{{- fail (printf "autoscaling.signals: %q is not a signal; want queueDepth, requestsWaiting or kvCacheUsage" .) -}}
{{- end -}}
{{- $out = append $out (dict "name" . "target" (get $targets . | toString)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
