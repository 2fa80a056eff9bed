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

{{/*
The Secret of operator token hashes: the user's, or the chart's (from
hashes, or generated). Exactly one of the three ways: without any, chime
would not start (pods stuck in ContainerCreating on a missing Secret).
*/}}
{{- define "chime.operatorTokensSecret" -}}
{{- $o := .Values.operatorTokens }}
{{- $ways := 0 }}
{{- if $o.hashes }}{{ $ways = add1 $ways }}{{ end }}
{{- if $o.existingSecret }}{{ $ways = add1 $ways }}{{ end }}
{{- if $o.generate }}{{ $ways = add1 $ways }}{{ end }}
{{- if eq $ways 0 }}
{{- fail "operatorTokens: chime requires operator tokens in a pod. Set operatorTokens.hashes (printf %s \"$TOKEN\" | sha256sum), operatorTokens.existingSecret (a Secret with one hash a line), or operatorTokens.generate=true (the chart makes a token; NOTES.txt says how to read it)" }}
{{- else if gt $ways 1 }}
{{- fail "operatorTokens: set one of hashes, existingSecret and generate, not several" }}
{{- end }}
{{- if and $o.generate (eq $o.key "token") }}
{{- fail "operatorTokens.generate: the generated Secret keeps the token under the key token; choose another operatorTokens.key" }}
{{- end }}
{{- default (printf "%s-operator-tokens" (include "chime.fullname" .)) $o.existingSecret }}
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
{{- $port := dig "config" "nats" "port" 4222 .Values.nats }}
{{- printf "%s://%s.%s.svc:%v" (ternary "tls" "nats" .Values.natsTLS.enabled) ($name | trunc 63 | trimSuffix "-") .Release.Namespace $port }}
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
{{- fail "natsAuth.enabled (the default: NATS authorization through chime's auth callout) needs natsAuth.existingSecret: run chime nats-config --dir DIR and put the seeds it wrote (chime-user.nk, chime-callout.nk, chime-responder.nk, chime-system.nk) in a Secret (see docs/runbook.md); or set natsAuth.enabled=false for a NATS that nothing but chime reaches" }}
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
  "jsReplicas" "CHIME_JS_REPLICAS" "shards" "CHIME_SHARDS" "partitions" "CHIME_PARTITIONS" "leaseTTL" "CHIME_LEASE_TTL"
  "inboxMaxAge" "CHIME_INBOX_MAX_AGE" "eventMaxAge" "CHIME_EVENT_MAX_AGE" "dedupWindow" "CHIME_DEDUP_WINDOW"
  "recordRetention" "CHIME_RECORD_RETENTION" "timezone" "CHIME_TIMEZONE" "logLevel" "CHIME_LOG_LEVEL"
  "logFormat" "CHIME_LOG_FORMAT" "maxTimersPerAgent" "CHIME_MAX_TIMERS_PER_AGENT"
  "maxWaitsPerAgent" "CHIME_MAX_WAITS_PER_AGENT"
  "maxOpenQuestionsPerAgent" "CHIME_MAX_OPEN_QUESTIONS_PER_AGENT" "minInterval" "CHIME_MIN_INTERVAL"
  "createRate" "CHIME_CREATE_RATE" "createBurst" "CHIME_CREATE_BURST" "inboxMaxBytes" "CHIME_INBOX_MAX_BYTES"
  "inboxMaxPerAgent" "CHIME_INBOX_MAX_PER_AGENT" "eventMaxBytes" "CHIME_EVENT_MAX_BYTES"
  "historyMaxBytes" "CHIME_HISTORY_MAX_BYTES"
  "notificationsMax" "CHIME_NOTIFICATIONS_MAX" "pprofAddr" "CHIME_PPROF_ADDR" "httpAccessLog" "CHIME_HTTP_ACCESS_LOG"
  "natsSessionMaxAge" "CHIME_NATS_SESSION_MAX_AGE"
  "timersMaxBytes" "CHIME_TIMERS_MAX_BYTES" "waitsMaxBytes" "CHIME_WAITS_MAX_BYTES"
  "tasksMaxBytes" "CHIME_TASKS_MAX_BYTES" "taskOutputsMaxBytes" "CHIME_TASK_OUTPUTS_MAX_BYTES"
  "notificationsMaxBytes" "CHIME_NOTIFICATIONS_MAX_BYTES" "questionsMaxBytes" "CHIME_QUESTIONS_MAX_BYTES"
  "mcpTasksMaxBytes" "CHIME_MCP_TASKS_MAX_BYTES" "monitorsMaxBytes" "CHIME_MONITORS_MAX_BYTES"
  "waitForMaxBytes" "CHIME_WAITFOR_MAX_BYTES" "idempotencyMaxBytes" "CHIME_IDEMPOTENCY_MAX_BYTES"
  "tokensMaxBytes" "CHIME_TOKENS_MAX_BYTES" "triggersMaxBytes" "CHIME_TRIGGERS_MAX_BYTES"
  "agentsMaxBytes" "CHIME_AGENTS_MAX_BYTES"
  "maxRunningTasksPerAgent" "CHIME_MAX_RUNNING_TASKS_PER_AGENT" "taskStartRate" "CHIME_TASK_START_RATE"
  "maxTaskOutputBytesPerAgent" "CHIME_MAX_TASK_OUTPUT_BYTES_PER_AGENT" "maxWaitForsPerAgent" "CHIME_MAX_WAITFORS_PER_AGENT"
  "maxMcpTasksPerAgent" "CHIME_MAX_MCP_TASKS_PER_AGENT" "maxMonitorsPerAgent" "CHIME_MAX_MONITORS_PER_AGENT" "monitorSubjects" "CHIME_MONITOR_SUBJECTS"
  "monitorKv" "CHIME_MONITOR_KV" "monitorUrls" "CHIME_MONITOR_URLS"
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

{{/*
TLS checks: each TLS setting names its Secret, and chime's side of NATS
TLS agrees with the NATS chart's.
*/}}
{{- define "chime.tlsCheck" -}}
{{- if and .Values.http.tls.enabled (not .Values.http.tls.existingSecret) }}
{{- fail "http.tls.enabled needs http.tls.existingSecret: a kubernetes.io/tls Secret (tls.crt, tls.key) with chime's HTTPS certificate" }}
{{- end }}
{{- if and .Values.natsTLS.enabled (not .Values.natsTLS.existingSecret) }}
{{- fail "natsTLS.enabled needs natsTLS.existingSecret: a Secret with the CA of the NATS servers (natsTLS.caKey) and, with natsTLS.clientCert, chime's client certificate and key" }}
{{- end }}
{{- if .Values.nats.enabled }}
{{- $serverTLS := dig "config" "nats" "tls" "enabled" false .Values.nats }}
{{- if and $serverTLS (not .Values.natsTLS.enabled) }}
{{- fail "nats.config.nats.tls.enabled: the NATS servers serve TLS, so chime needs natsTLS (the CA that signed their certificate)" }}
{{- else if and .Values.natsTLS.enabled (not $serverTLS) }}
{{- fail "natsTLS.enabled with nats.enabled needs nats.config.nats.tls.enabled: the NATS chart's servers serve plain NATS" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The labels of the NATS chart's server pods (its nats.selectorLabels).
*/}}
{{- define "chime.natsSelectorLabels" -}}
app.kubernetes.io/name: {{ default "nats" .Values.nats.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: nats
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
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" .Values.http.tls.enabled) (include "chime.fullname" .) .Release.Namespace .Values.service.port }}
{{- end }}
{{- end }}
