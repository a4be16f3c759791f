{{/* Names and labels shared by every template. */}}
{{- define "railyard.name" -}}railyard{{- end -}}

{{- define "railyard.fullname" -}}
{{- if contains "railyard" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-railyard" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "railyard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "railyard.labels" -}}
app.kubernetes.io/name: {{ include "railyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: include with (list . "extender") */}}
{{- define "railyard.selector" -}}
{{- $top := index . 0 -}}
app.kubernetes.io/name: {{ include "railyard.name" $top }}
app.kubernetes.io/instance: {{ $top.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "railyard.extender" -}}{{ include "railyard.fullname" . }}-extender{{- end -}}
{{- define "railyard.agent" -}}{{ include "railyard.fullname" . }}-agent{{- end -}}
{{- define "railyard.service" -}}{{ include "railyard.fullname" . }}-scheduler{{- end -}}

{{/* The agent config file (docs/agent.md, "Config file"). */}}
{{- define "railyard.agentMode" -}}
{{- if not (has .Values.agent.mode (list "extender" "dra")) -}}
{{- fail (printf "agent.mode: expected extender or dra, got %v" .Values.agent.mode) -}}
{{- end -}}
{{- .Values.agent.mode -}}
{{- end -}}

{{- define "railyard.agentConfig" -}}
resources:
  gpu: {{ .Values.agent.resources.gpu }}
  vf: {{ .Values.agent.resources.vf }}
  pf: {{ .Values.agent.resources.pf }}
gpuPlugin: {{ .Values.agent.gpus.enabled }}
vfPlugin: {{ .Values.agent.vfs.enabled }}
pfPlugin: {{ .Values.agent.pfs.enabled }}
{{- with .Values.agent.pools }}
pools:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.agent.vfPools }}
vfPools:
  resourceList:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- with .Values.agent.pairMap }}
pairMap:
  ncclGpuNicAffinity: {{ .ncclGpuNicAffinity }}
  podIfname: {{ .podIfname | quote }}
  podIfnameScheme: {{ .podIfnameScheme | quote }}
{{- end }}
{{- with .Values.agent.rails }}
{{- if kindIs "string" . }}
rails: {{ . | quote }}
{{- else }}
rails:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- if eq .Values.agent.mode "dra" }}
mode: dra
dra:
  publishGpus: {{ .Values.dra.publishGpus }}
  cdiDir: {{ .Values.dra.cdiDir }}
{{- end }}
devinfoDir: {{ .Values.agent.hostPaths.devinfoDir }}/dp
cniDevinfoDir: {{ .Values.agent.hostPaths.devinfoDir }}/cni
{{- with .Values.koordinator }}
{{- if or .publishDevices .honourDeviceAllocated }}
koordinator:
  publishDevices: {{ .publishDevices }}
  honourDeviceAllocated: {{ .honourDeviceAllocated }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The VF pools besides the default one, by resource name, one a line (docs/decisions/0085):
what the extender's --vf-pool flags and kube-scheduler's managedResources list. A pool
without resourcePrefix is railyard.dev's, as the agent reads it. */}}
{{- define "railyard.otherVfPools" -}}
{{- range .Values.agent.vfPools }}
{{- $name := printf "%s/%s" (default "railyard.dev" .resourcePrefix) .resourceName }}
{{- if ne $name $.Values.agent.resources.vf }}
{{ $name }}
{{- end }}
{{- end }}
{{- end -}}
