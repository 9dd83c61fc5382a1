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
