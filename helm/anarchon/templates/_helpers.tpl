{{/*
Helpers shared by the chart's objects and by the sidecar templates.

They use only .Values and .Release (never .Chart or .Template), so a parent
chart can call the sidecar templates with this chart's values:
  (dict "Values" .Values.anarchon "Release" .Release "Capabilities" .Capabilities)
and get the same names as the objects this chart created.
*/}}

{{- define "anarchon.name" -}}
{{- default "anarchon" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "anarchon.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "anarchon.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding anarchon.toml. */}}
{{- define "anarchon.configMapName" -}}
{{- printf "%s-config" (include "anarchon.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{/* The headless Service that --peer-dns resolves. */}}
{{- define "anarchon.meshServiceName" -}}
{{- printf "%s-mesh" (include "anarchon.fullname" . | trunc 58 | trimSuffix "-") }}
{{- end }}

{{- define "anarchon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "anarchon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "anarchon.labels" -}}
{{ include "anarchon.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Chart }}
app.kubernetes.io/version: {{ .AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Name .Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels of the pods that run the sidecar: the headless Service's selector. */}}
{{- define "anarchon.meshSelector" -}}
{{- if .Values.mesh.selector }}
{{- toYaml .Values.mesh.selector }}
{{- else }}
{{- include "anarchon.selectorLabels" . }}
{{- end }}
{{- end }}

{{- define "anarchon.image" -}}
{{- $tag := .Values.image.tag | default (.Chart | default dict).AppVersion }}
{{- if and (not $tag) (not .Values.image.digest) }}
{{- fail "image.tag is required when the anarchon templates are called without this chart's .Chart (pass .Subcharts.anarchon, or set image.tag)" }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* "true" when TLS is configured. */}}
{{- define "anarchon.tls" -}}
{{- if .Values.secrets.tls.name }}true{{ end }}
{{- end }}

{{/* grpc or http: the probe kind actually rendered. */}}
{{- define "anarchon.probeType" -}}
{{- $t := .Values.sidecar.probes.type }}
{{- if eq $t "auto" }}
{{- if include "anarchon.tls" . }}http{{ else }}grpc{{ end }}
{{- else }}
{{- $t }}
{{- end }}
{{- end }}

{{/* The backend URL, when it goes into the ConfigMap (no Secret involved). */}}
{{- define "anarchon.backendInConfig" -}}
{{- if and .Values.backend.url (not .Values.backend.urlSecret.name) (not .Values.backend.passwordSecret.name) }}
{{- .Values.backend.url }}
{{- end }}
{{- end }}

{{/* "true" when the backend is SQLite (one file per pod). */}}
{{- define "anarchon.sqlite" -}}
{{- if and (not .Values.backend.urlSecret.name) (or (not .Values.backend.url) (hasPrefix "sqlite:" .Values.backend.url)) }}true{{ end }}
{{- end }}

{{/* The peer_dns entries: the headless Service, then any extra names. */}}
{{- define "anarchon.peerDns" -}}
{{- $names := list }}
{{- if .Values.mesh.enabled }}
{{- $names = append $names (printf "%s.%s.svc.%s:%d" (include "anarchon.meshServiceName" .) .Release.Namespace .Values.clusterDomain (int .Values.sidecar.ports.grpc)) }}
{{- end }}
{{- range .Values.mesh.peerDns }}
{{- $names = append $names . }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/*
anarchon.toml. Numbers arrive from YAML as floats and are printed as integers;
strings and lists as JSON, which is valid TOML for them.
*/}}
{{- define "anarchon.configToml" -}}
# anarchon.toml, rendered by the anarchon Helm chart.
# listen, admin_listen, data_dir and advertise are set by the container's
# ANARCHON_* environment (it wins over this file), labels by --label flags and
# secret files by --*-file flags.
{{- with include "anarchon.backendInConfig" . }}
backend = {{ toJson . }}
{{- end }}
{{- with .Values.mesh.peers }}
peer = {{ toJson . }}
{{- end }}
{{- $dns := include "anarchon.peerDns" . | fromJsonArray }}
{{- if $dns }}
peer_dns = {{ toJson $dns }}
{{- end }}
{{- $cfg := .Values.config }}
{{- range $k := keys $cfg | sortAlpha }}
{{- $v := index $cfg $k }}
{{- if kindIs "invalid" $v }}
{{- else if or (kindIs "float64" $v) (kindIs "int64" $v) (kindIs "int" $v) }}
{{ $k }} = {{ int64 $v }}
{{- else if kindIs "bool" $v }}
{{ $k }} = {{ $v }}
{{- else if kindIs "string" $v }}
{{ $k }} = {{ toJson $v }}
{{- else }}
{{- fail (printf "config.%s: only numbers, booleans and strings are supported" $k) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Seconds the sidecar sleeps in preStop (0 = no hook). */}}
{{- define "anarchon.preStopSleepSeconds" -}}
{{- $s := .Values.shutdown.preStopSleepSeconds }}
{{- if kindIs "invalid" $s }}
{{- if .Values.sidecar.native }}0{{ else }}{{ int .Values.shutdown.appSeconds }}{{ end }}
{{- else }}
{{- int $s }}
{{- end }}
{{- end }}

{{/* Seconds the sidecar may take from SIGTERM to exit: ceil(drain_ms / 1000). */}}
{{- define "anarchon.drainSeconds" -}}
{{- $ms := int64 (default 5000 .Values.config.drain_ms) }}
{{- div (add $ms 999) 1000 }}
{{- end }}

{{/*
The pod's terminationGracePeriodSeconds, aligned with the drain. Include it in
your pod spec:
  terminationGracePeriodSeconds: {{ include "anarchon.terminationGracePeriodSeconds" . }}
*/}}
{{- define "anarchon.terminationGracePeriodSeconds" -}}
{{- $pre := int (include "anarchon.preStopSleepSeconds" .) }}
{{- $drain := int (include "anarchon.drainSeconds" .) }}
{{- $sidecar := add $pre $drain }}
{{- $app := int .Values.shutdown.appSeconds }}
{{- $margin := int .Values.shutdown.marginSeconds }}
{{- $given := .Values.shutdown.terminationGracePeriodSeconds }}
{{- if not (kindIs "invalid" $given) }}
{{- if lt (int $given) (int (add $sidecar 1)) }}
{{- fail (printf "shutdown.terminationGracePeriodSeconds (%d) must exceed the sidecar's preStop sleep + drain (%d s): the kubelet would SIGKILL it before it has handed over its leases" (int $given) $sidecar) }}
{{- end }}
{{- int $given }}
{{- else if .Values.sidecar.native }}
{{- add $app $sidecar $margin }}
{{- else }}
{{- add (max $app $sidecar) $margin }}
{{- end }}
{{- end }}

{{/*
Pod annotations: Prometheus scraping of the admin port, and a checksum of the
config so that a config change rolls the pods.
*/}}
{{- define "anarchon.podAnnotations" -}}
checksum/anarchon-config: {{ include "anarchon.configToml" . | sha256sum }}
{{- if .Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.sidecar.ports.admin | int | quote }}
prometheus.io/path: {{ .Values.metrics.path | quote }}
{{- end }}
{{- end }}

{{/* Checks the values; fails with a message naming the value. */}}
{{- define "anarchon.validate" -}}
{{- $c := .Values.config }}
{{- if and $c.heartbeat_ms (lt (int64 $c.heartbeat_ms) 50) }}
{{- fail "config.heartbeat_ms must be at least 50" }}
{{- end }}
{{- $hb := int64 (default 1000 $c.heartbeat_ms) }}
{{- $exp := int64 (default 10000 $c.expiry_ms) }}
{{- if lt $exp (mul 3 $hb) }}
{{- fail (printf "config.expiry_ms (%d) must be at least 3 × heartbeat_ms (%d)" $exp (mul 3 $hb)) }}
{{- end }}
{{- $b := .Values.backend }}
{{- if and $b.passwordSecret.name (not (contains "$(BACKEND_PASSWORD)" $b.url)) }}
{{- fail "backend.passwordSecret is set but backend.url does not contain $(BACKEND_PASSWORD)" }}
{{- end }}
{{- if and (contains "$(BACKEND_PASSWORD)" $b.url) (not $b.passwordSecret.name) }}
{{- fail "backend.url uses $(BACKEND_PASSWORD): set backend.passwordSecret.name" }}
{{- end }}
{{- if and .Values.example.enabled (gt (int .Values.example.replicas) 1) (include "anarchon.sqlite" .) }}
{{- fail "example.replicas > 1 needs a shared backend: with SQLite every pod has its own file in its own emptyDir, so two pods could both win a claim. Set backend.url (postgres://, redis://, amqp://, nats://)" }}
{{- end }}
{{- if and .Values.mesh.enabled (not .Values.example.enabled) (not .Values.mesh.selector) }}
{{- fail "mesh.selector must name your pods' labels when example.enabled is false: the headless Service would select nothing" }}
{{- end }}
{{- $peers := or .Values.mesh.enabled .Values.mesh.peers .Values.mesh.peerDns }}
{{- if and .Values.secrets.tls.name $peers (not .Values.secrets.tls.caKey) }}
{{- fail "secrets.tls.caKey is required with TLS and peers: it is the CA peers' certificates are checked against" }}
{{- end }}
{{- if not (has .Values.sidecar.probes.type (list "auto" "grpc" "http")) }}
{{- fail "sidecar.probes.type must be auto, grpc or http" }}
{{- end }}
{{- if and (eq (include "anarchon.probeType" .) "grpc") .Values.secrets.tls.name }}
{{- fail "sidecar.probes.type grpc cannot work with TLS: the kubelet's gRPC probe speaks plaintext only; use auto or http" }}
{{- end }}
{{- $u := .Values.sidecar.unixSocket }}
{{- if $u.enabled }}
{{- $sock := include "anarchon.unixSocketPath" . }}
{{- if gt (len $sock) 107 }}
{{- fail (printf "sidecar.unixSocket: %s is %d bytes; a Unix socket's path must be at most 107 (shorten dir or name)" $sock (len $sock)) }}
{{- end }}
{{- if has (clean $u.dir) (list (clean .Values.sidecar.dataDir) "/tmp" "/etc/anarchon/config" "/etc/anarchon/secrets" "/var/run/anarchon") }}
{{- fail (printf "sidecar.unixSocket.dir %s is already a mount of the sidecar or the app; give the socket its own directory" $u.dir) }}
{{- end }}
{{- end }}
{{- $kube := .Capabilities.KubeVersion.Version }}
{{- if and .Values.sidecar.native (semverCompare "<1.29.0-0" $kube) }}
{{- fail (printf "sidecar.native needs Kubernetes >= 1.29 (this is %s); set sidecar.native=false" $kube) }}
{{- end }}
{{- if and (gt (int (include "anarchon.preStopSleepSeconds" .)) 0) (semverCompare "<1.30.0-0" $kube) }}
{{- fail (printf "the preStop sleep action needs Kubernetes >= 1.30 (this is %s); set shutdown.preStopSleepSeconds=0" $kube) }}
{{- end }}
{{- $_ := include "anarchon.terminationGracePeriodSeconds" . }}
{{- end }}

{{/* The sidecar's Unix socket, "<dir>/<name>" (sidecar.unixSocket). */}}
{{- define "anarchon.unixSocketPath" -}}
{{- $u := .Values.sidecar.unixSocket -}}
{{- printf "%s/%s" (trimSuffix "/" $u.dir) $u.name -}}
{{- end }}
