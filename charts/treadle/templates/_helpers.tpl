{{/*
Named templates shared by the chart's manifests. The templates keep to a small
Go-template subset that tests/chart/render.py renders without Helm.
*/}}

{{/* The prefix of every object's name: the release name unless overridden. */}}
{{- define "treadle.fullname" -}}
{{ default .Release.Name .Values.fullnameOverride }}
{{- end }}

{{/* Labels that select the operator's pods; never change them on upgrade. */}}
{{- define "treadle.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "treadle.labels" -}}
{{ include "treadle.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: treadle
app.kubernetes.io/managed-by: Helm
{{- end }}

{{/* The operator's ServiceAccount: the name given, else the full name. */}}
{{- define "treadle.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{ .Values.serviceAccount.name }}
{{- else -}}
{{ include "treadle.fullname" . }}
{{- end }}
{{- end }}

{{/*
The operator's rules on namespaced resources (treadle_operator.permissions.
namespace_rules): the ClusterRole's and each namespace's Role's. Secrets: get, by
name only (rbac.worldSecretNames).
*/}}
{{- define "treadle.namespacedRules" -}}
- apiGroups: ["treadle.dev"]
  resources: ["workflowdeployments", "workflowruns"]
  verbs: ["get", "list", "watch", "patch", "create", "delete"]
- apiGroups: ["treadle.dev"]
  resources: ["workflowdeployments/status", "workflowruns/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["treadle.dev"]
  resources: ["workflowdeployments/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
- apiGroups: ["treadle.dev"]
  resources: ["workflowsignals"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["treadle.dev"]
  resources: ["workflowsignals/status"]
  verbs: ["get", "patch"]
- apiGroups: ["treadle.dev"]
  resources: ["workflowschedules"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["treadle.dev"]
  resources: ["workflowschedules/status"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
  resourceNames:
    {{- range .Values.rbac.worldSecretNames }}
    - {{ . | quote }}
    {{- end }}
    {{- range .Values.rbac.inputSecretNames }}
    - {{ . | quote }}
    {{- end }}
{{- end }}

{{/* rbac.inputSecretNames as the comma-separated TREADLE_OPERATOR_INPUT_SECRETS. */}}
{{- define "treadle.inputSecrets" -}}
{{- range .Values.rbac.inputSecretNames }}{{ . }},{{ end }}
{{- end }}

{{/* The webhook Service's names: the serving certificate's subject alternative names. */}}
{{- define "treadle.webhookHosts" -}}
{{ include "treadle.fullname" . }}-webhook.{{ .Release.Namespace }}.svc,{{ include "treadle.fullname" . }}-webhook.{{ .Release.Namespace }}.svc.cluster.local,{{ include "treadle.fullname" . }}-webhook.{{ .Release.Namespace }},{{ include "treadle.fullname" . }}-webhook
{{- end }}

{{/* worldHosts as the comma-separated TREADLE_OPERATOR_WORLD_HOSTS. */}}
{{- define "treadle.worldHosts" -}}
{{- range .Values.worldHosts }}{{ . }},{{ end }}
{{- end }}

{{/* Labels that select treadle serve's pods (templates/serve.yaml); never change them. */}}
{{- define "treadle.serveSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: serve
{{- end }}

{{/* Labels on treadle serve's objects. */}}
{{- define "treadle.serveLabels" -}}
{{ include "treadle.serveSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: treadle
app.kubernetes.io/managed-by: Helm
{{- end }}
