{{/* Names */}}
{{- define "k8s-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "k8s-bridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "k8s-bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "k8s-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "k8s-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "k8s-bridge.labels" -}}
helm.sh/chart: {{ include "k8s-bridge.chart" . }}
{{ include "k8s-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "k8s-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "k8s-bridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The bridge config as it is written to bridge.yaml: .Values.config verbatim, plus
the leaderElection block the chart owns when .Values.leaderElection.enabled
(keys the user set under config.leaderElection win, except `enabled`).
*/}}
{{- define "k8s-bridge.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- if .Values.leaderElection.enabled -}}
{{- $le := dict "namespace" .Release.Namespace "leaseName" (include "k8s-bridge.fullname" .) -}}
{{- $le = mergeOverwrite $le (deepCopy (default (dict) (get $cfg "leaderElection"))) -}}
{{- $_ := set $le "enabled" true -}}
{{- $_ := set $cfg "leaderElection" $le -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The leaderElection block in effect (empty dict when off). */}}
{{- define "k8s-bridge.leaderElection" -}}
{{- $cfg := include "k8s-bridge.config" . | fromYaml -}}
{{- $le := default (dict) (get $cfg "leaderElection") -}}
{{- if get $le "enabled" -}}
{{- $out := dict "enabled" true "namespace" (default "default" (get $le "namespace")) "leaseName" (default "k8s-bridge" (get $le "leaseName")) -}}
{{- toYaml $out -}}
{{- else -}}
{{- toYaml (dict "enabled" false) -}}
{{- end -}}
{{- end -}}

{{/*
Who may call POST /snapshot, as the bridge resolves server.controlAuth:
kubernetes | token | none (omitted: token when controlToken is set, else kubernetes).
*/}}
{{- define "k8s-bridge.controlAuth" -}}
{{- $server := default (dict) (get .Values.config "server") -}}
{{- if get $server "controlAuth" -}}
{{- get $server "controlAuth" -}}
{{- else if get $server "controlToken" -}}
token
{{- else -}}
kubernetes
{{- end -}}
{{- end -}}

{{- define "k8s-bridge.serverPort" -}}
{{- $server := default (dict) (get .Values.config "server") -}}
{{- default 8080 (get $server "port") -}}
{{- end -}}

{{/*
API group of a resource entry: "apps/v1" → "apps", "v1" → "" (core).
*/}}
{{- define "k8s-bridge.apiGroup" -}}
{{- if contains "/" .apiVersion -}}
{{- index (splitList "/" .apiVersion) 0 -}}
{{- end -}}
{{- end -}}

{{/*
Resource (plural) name of a resource entry. The chart cannot ask discovery, so it
guesses the way English and Kubernetes kinds mostly go: lowercase, then
"endpoints" stays, -s/-x/-z/-ch/-sh take "es", consonant+y becomes "ies", else
"s". An entry's `plural` overrides the guess.
*/}}
{{- define "k8s-bridge.plural" -}}
{{- if .plural -}}
{{- .plural -}}
{{- else -}}
{{- $k := lower .kind -}}
{{- if hasSuffix "endpoints" $k -}}
{{- $k -}}
{{- else if regexMatch "(s|x|z|ch|sh)$" $k -}}
{{- printf "%ses" $k -}}
{{- else if regexMatch "[^aeiou]y$" $k -}}
{{- printf "%sies" (trimSuffix "y" $k) -}}
{{- else -}}
{{- printf "%ss" $k -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Rules for a set of resource entries, one per (group, resource), sorted: verbs
list and watch, nothing else.
*/}}
{{- define "k8s-bridge.watchRules" -}}
{{- $rules := dict -}}
{{- range . -}}
{{- $group := include "k8s-bridge.apiGroup" . -}}
{{- $plural := include "k8s-bridge.plural" . -}}
{{- $_ := set $rules (printf "%s/%s" $group $plural) (list $group $plural) -}}
{{- end -}}
{{- range $key, $rule := $rules }}
- apiGroups: [{{ index $rule 0 | quote }}]
  resources: [{{ index $rule 1 | quote }}]
  verbs: ["list", "watch"]
{{- end -}}
{{- end -}}
