{{/* The chart's name, or nameOverride. */}}
{{- define "consulbind.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: fullnameOverride, or the release name when it already says the chart's name. */}}
{{- define "consulbind.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "consulbind.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "consulbind.selectorLabels" -}}
app.kubernetes.io/name: {{ include "consulbind.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The `helm test` pod's: not the controller's, so that no Service, budget or policy of the controller takes it for one. */}}
{{- define "consulbind.testSelectorLabels" -}}
app.kubernetes.io/name: {{ include "consulbind.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "consulbind.labels" -}}
{{ include "consulbind.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "consulbind.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "consulbind.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The checksum key Secret: a name in the release namespace, or namespace/name. */}}
{{- define "consulbind.checksumKeyNamespace" -}}
{{- if contains "/" .Values.controller.checksumKeySecret -}}
{{- first (splitList "/" .Values.controller.checksumKeySecret) -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- define "consulbind.checksumKeyName" -}}
{{- last (splitList "/" .Values.controller.checksumKeySecret) -}}
{{- end -}}

{{/*
Exactly the API calls the controller makes in a namespace it serves (the same rules as
config/rbac/): bindings (list, watch, status patch), workloads and Argo Rollouts (list, watch,
patch of one pod-template annotation), CronJobs likewise, token Secrets and bound ConfigMaps and
Secrets (list, watch), and events.
*/}}
{{- define "consulbind.rules" -}}
- apiGroups: ["consulbind.dev"]
  resources: ["consulbindings"]
  verbs: ["list", "watch"]
- apiGroups: ["consulbind.dev"]
  resources: ["consulbindings/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets", "daemonsets"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["argoproj.io"]
  resources: ["rollouts"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["list", "watch", "patch"]
- apiGroups: [""]
  resources: ["secrets", "configmaps"]
  verbs: ["list", "watch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}
