{{/* The chart's name, and the release's full name (63 characters at most). */}}
{{- define "chime.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "chime.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "chime.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "chime.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "chime.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "chime.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "chime.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret of operator token hashes: the user's, or the chart's. */}}
{{- define "chime.operatorTokensSecret" -}}
{{- if and .Values.operatorTokens.existingSecret .Values.operatorTokens.hashes }}
{{- fail "operatorTokens: set hashes or existingSecret, not both" }}
{{- end }}
{{- default (printf "%s-operator-tokens" (include "chime.fullname" .)) .Values.operatorTokens.existingSecret }}
{{- end }}

{{/*
The NATS URL: the NATS chart's client Service (named as that chart names
it: the release name when it contains "nats", else <release>-nats), or
externalNats.url. Exactly one of the two.
*/}}
{{- define "chime.natsURL" -}}
{{- if .Values.nats.enabled }}
{{- if .Values.externalNats.url }}
{{- fail "externalNats.url is set and nats.enabled is true: set nats.enabled=false to use an existing NATS cluster" }}
{{- end }}
{{- $name := "" }}
{{- if .Values.nats.fullnameOverride }}
{{- $name = .Values.nats.fullnameOverride }}
{{- else if contains "nats" .Release.Name }}
{{- $name = .Release.Name }}
{{- else }}
{{- $name = printf "%s-nats" .Release.Name }}
{{- end }}
{{- printf "nats://%s.%s.svc:4222" ($name | trunc 63 | trimSuffix "-") .Release.Namespace }}
{{- else }}
{{- required "NATS: set nats.enabled=true (the NATS chart) or externalNats.url (an existing cluster)" .Values.externalNats.url }}
{{- end }}
{{- end }}

{{/*
NATS authorization checks: the keys Secret is given, and with the NATS
chart, its servers are given chime's authorization block.
*/}}
{{- define "chime.natsAuthCheck" -}}
{{- if .Values.natsAuth.enabled }}
{{- if not .Values.natsAuth.existingSecret }}
{{- fail "natsAuth.enabled needs natsAuth.existingSecret: a Secret with the seeds chime nats-config wrote (chime-user.nk, chime-callout.nk)" }}
{{- end }}
{{- if .Values.nats.enabled }}
{{- $auth := dig "config" "merge" "authorization" dict .Values.nats }}
{{- if not (dig "auth_callout" "issuer" "" $auth) }}
{{- fail "natsAuth.enabled with nats.enabled needs nats.config.merge.authorization: the block chime nats-config prints (users, auth_callout.issuer, auth_callout.auth_users)" }}
{{- end }}
{{- end }}
{{- if or .Values.externalNats.credentials.existingSecret .Values.externalNats.token.existingSecret }}
{{- fail "natsAuth.enabled: chime connects with its nkey (natsAuth.existingSecret); unset externalNats.credentials and externalNats.token" }}
{{- end }}
{{- else if and .Values.nats.enabled (dig "config" "merge" "authorization" "auth_callout" "" .Values.nats) }}
{{- fail "nats.config.merge.authorization has chime's auth callout but natsAuth.enabled is false: chime could not connect" }}
{{- end }}
{{- end }}

{{/*
The CHIME_* variables of config, each when its value is set: an empty
string or null leaves chime's default. Whole numbers come out without an
exponent (values read 1000000 as a float).
*/}}
{{- define "chime.configEnv" -}}
{{- $names := dict
  "jsReplicas" "CHIME_JS_REPLICAS" "shards" "CHIME_SHARDS" "leaseTTL" "CHIME_LEASE_TTL"
  "inboxMaxAge" "CHIME_INBOX_MAX_AGE" "eventMaxAge" "CHIME_EVENT_MAX_AGE" "dedupWindow" "CHIME_DEDUP_WINDOW"
  "recordRetention" "CHIME_RECORD_RETENTION" "timezone" "CHIME_TIMEZONE" "logLevel" "CHIME_LOG_LEVEL"
  "logFormat" "CHIME_LOG_FORMAT" "maxTimersPerAgent" "CHIME_MAX_TIMERS_PER_AGENT"
  "maxWaitsPerAgent" "CHIME_MAX_WAITS_PER_AGENT"
  "maxOpenQuestionsPerAgent" "CHIME_MAX_OPEN_QUESTIONS_PER_AGENT" "minInterval" "CHIME_MIN_INTERVAL"
  "createRate" "CHIME_CREATE_RATE" "createBurst" "CHIME_CREATE_BURST" "inboxMaxBytes" "CHIME_INBOX_MAX_BYTES"
  "inboxMaxPerAgent" "CHIME_INBOX_MAX_PER_AGENT" "eventMaxBytes" "CHIME_EVENT_MAX_BYTES"
  "notificationsMax" "CHIME_NOTIFICATIONS_MAX" "pprofAddr" "CHIME_PPROF_ADDR"
  "maxRunningTasksPerAgent" "CHIME_MAX_RUNNING_TASKS_PER_AGENT" "taskStartRate" "CHIME_TASK_START_RATE"
  "maxTaskOutputBytesPerAgent" "CHIME_MAX_TASK_OUTPUT_BYTES_PER_AGENT" "maxWaitForsPerAgent" "CHIME_MAX_WAITFORS_PER_AGENT"
  "notifyRate" "CHIME_NOTIFY_RATE" "maxStreamsPerPrincipal" "CHIME_MAX_STREAMS_PER_PRINCIPAL" }}
{{- range $key, $v := .Values.config }}
{{- if not (hasKey $names $key) }}
{{- if ne $key "publicURL" }}
{{- fail (printf "config.%s: no such setting (see values.yaml for the CHIME_* variables)" $key) }}
{{- end }}
{{- else if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v ""))) }}
{{- if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) }}
{{- $v = int64 $v }}
{{- end }}
- name: {{ get $names $key }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* CHIME_PUBLIC_URL: config.publicURL, else the first ingress host. */}}
{{- define "chime.publicURL" -}}
{{- if .Values.config.publicURL }}
{{- .Values.config.publicURL }}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts }}
{{- $host := first .Values.ingress.hosts }}
{{- $tls := false }}
{{- range .Values.ingress.tls }}{{ if has $host .hosts }}{{ $tls = true }}{{ end }}{{ end }}
{{- printf "%s://%s" (ternary "https" "http" $tls) $host }}
{{- else }}
{{- printf "http://%s.%s.svc:%v" (include "chime.fullname" .) .Release.Namespace .Values.service.port }}
{{- end }}
{{- end }}
