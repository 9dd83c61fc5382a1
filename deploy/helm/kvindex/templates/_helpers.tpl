{{- define "kvindex.fullname" -}}
{{- printf "%s" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- define "kvindex.labels" -}}
app.kubernetes.io/name: kvindex
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "kvindex.image" -}}
{{- printf "%s/%s:%s" .root.Values.image.repository .name (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- end -}}
{{- define "kvindex.indexer" -}}{{ include "kvindex.fullname" . }}-indexer{{- end -}}
{{- define "kvindex.router" -}}{{ include "kvindex.fullname" . }}-router{{- end -}}
{{- /* A ServiceAccount .name bound to a Role that may get, list and watch the
pods of the release namespace (Kubernetes discovery). */ -}}
{{- define "kvindex.podReader" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  labels: {{- include "kvindex.labels" .root | nindent 4 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .name }}-pods
  labels: {{- include "kvindex.labels" .root | nindent 4 }}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .name }}-pods
  labels: {{- include "kvindex.labels" .root | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: {{ .name }}-pods}
subjects:
- {kind: ServiceAccount, name: {{ .name }}, namespace: {{ .root.Release.Namespace }}}
{{- end -}}
