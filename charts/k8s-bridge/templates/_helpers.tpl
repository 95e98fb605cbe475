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
{{- $sharding := default (dict) .Values.sharding -}}
{{- if gt (int (default 0 $sharding.replicas)) 0 -}}
{{- $sh := deepCopy (default (dict) (get $cfg "sharding")) -}}
{{- $_ := set $sh "shards" (int $sharding.replicas) -}}
{{- $_ := set $sh "by" (default "uid" $sharding.by) -}}
{{- $_ := unset $sh "shardIndex" -}}
{{- $_ := set $cfg "sharding" $sh -}}
{{- end -}}
{{- if or .Values.leaderElection.enabled (and (gt (int (default 0 $sharding.replicas)) 0) $sharding.standby) -}}
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
{{- if .allKinds -}}
*
{{- else if hasKey . "group" -}}
{{- .group -}}
{{- else if contains "/" (default "" .apiVersion) -}}
{{- index (splitList "/" .apiVersion) 0 -}}
{{- end -}}
{{- end -}}

{{/*
Resource names the rules of one entry grant: the entry's plural for an entry
naming one kind; for an entry selecting kinds (group, kinds, allKinds) the plural
of each kind it names, or "*" when it selects by pattern (kinds: ["*"], the
default) or allKinds: the kinds are known only to discovery, at run time.
*/}}
{{- define "k8s-bridge.plurals" -}}
{{- if .kind -}}
{{- list (include "k8s-bridge.plural" .) | toJson -}}
{{- else -}}
{{- $kinds := default (list "*") .kinds -}}
{{- $out := list -}}
{{- range $kinds -}}
{{- if or $.allKinds (regexMatch "[*?\\[]" .) -}}
{{- $out = append $out "*" -}}
{{- else -}}
{{- $out = append $out (include "k8s-bridge.plural" (dict "kind" .)) -}}
{{- end -}}
{{- end -}}
{{- if has "*" $out -}}
{{- list "*" | toJson -}}
{{- else -}}
{{- $out | toJson -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether any entry selects kinds (group, kinds, allKinds): "true" or "". */}}
{{- define "k8s-bridge.selectsKinds" -}}
{{- range .Values.config.resources -}}
{{- if not .kind -}}true{{- end -}}
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
{{- range (include "k8s-bridge.plurals" . | fromJsonArray) -}}
{{- $_ := set $rules (printf "%s/%s" $group .) (list $group .) -}}
{{- end -}}
{{- end -}}
{{- range $key, $rule := $rules }}
- apiGroups: [{{ index $rule 0 | quote }}]
  resources: [{{ index $rule 1 | quote }}]
  verbs: ["list", "watch"]
{{- end -}}
{{- end -}}

{{/* sharding.replicas in effect (0: not a sharded StatefulSet). */}}
{{- define "k8s-bridge.shardReplicas" -}}
{{- int (default 0 (default (dict) .Values.sharding).replicas) -}}
{{- end -}}

{{/* The Lease names leader election uses: one per shard in the sharded standby mode. */}}
{{- define "k8s-bridge.leaseNames" -}}
{{- $le := include "k8s-bridge.leaderElection" . | fromYaml -}}
{{- $n := int (include "k8s-bridge.shardReplicas" .) -}}
{{- $names := list $le.leaseName -}}
{{- if gt $n 0 -}}
{{- $names = list -}}
{{- range $i := until $n -}}
{{- $names = append $names (printf "%s-shard-%d" $le.leaseName $i) -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/*
The pod template of the Deployment and of the sharded StatefulSets. "shard": the
pod's index (label apps.kubernetes.io/pod-index) is its shard index (with a
standby, the bridge elects on <leaseName>-shard-<index> by itself).
*/}}
{{- define "k8s-bridge.podTemplate" -}}
{{- $shard := .shard -}}
{{- with .root -}}
{{- $le := include "k8s-bridge.leaderElection" . | fromYaml -}}
metadata:
  annotations:
    checksum/config: {{ include "k8s-bridge.config" . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "k8s-bridge.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "k8s-bridge.serviceAccountName" . }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  containers:
    - name: bridge
      image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["run", "--config", "/etc/k8s-bridge/bridge.yaml"]
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if $shard }}
        - name: POD_INDEX
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        - name: BRIDGE_SHARDING__SHARDINDEX
          value: "$(POD_INDEX)"
        {{- end }}
        {{- if $le.enabled }}
        - name: BRIDGE_LEADERELECTION__IDENTITY
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .Values.envFromSecrets }}
      envFrom:
        {{- range . }}
        - secretRef:
            name: {{ . }}
            optional: true
        {{- end }}
      {{- end }}
      ports:
        - name: http
          containerPort: {{ include "k8s-bridge.serverPort" . }}
          protocol: TCP
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 10
        failureThreshold: 6
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
        periodSeconds: 5
        failureThreshold: 2
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/k8s-bridge
          readOnly: true
        - name: state
          mountPath: {{ .Values.persistence.mountPath }}
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: config
      configMap:
        name: {{ include "k8s-bridge.fullname" . }}
    {{- if not (and $shard .Values.persistence.enabled) }}
    {{- /* a sharded StatefulSet claims "state" per pod (volumeClaimTemplates) */}}
    - name: state
      {{- if .Values.persistence.enabled }}
      persistentVolumeClaim:
        claimName: {{ .Values.persistence.existingClaim | default (include "k8s-bridge.fullname" .) }}
      {{- else }}
      emptyDir: {}
      {{- end }}
    {{- end }}
    - name: tmp
      emptyDir: {}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end -}}
