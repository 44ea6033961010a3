{{/*
"anarchon.sidecar": the sidecar container, as one YAML list item. Include it
in a pod spec, under initContainers when sidecar.native (the default) or under
containers otherwise:

  initContainers:
    {{- include "anarchon.sidecar" . | nindent 4 }}

"anarchon.volumes": the volumes it mounts (config, data, tmp, secrets, and
the Unix socket's directory with sidecar.unixSocket.enabled), as
YAML list items, for the same pod's volumes:

  volumes:
    {{- include "anarchon.volumes" . | nindent 4 }}

From a parent chart that depends on this one, pass this chart's scope:
  {{- include "anarchon.sidecar" .Subcharts.anarchon | nindent 4 }}
*/}}

{{- define "anarchon.sidecar" -}}
{{- include "anarchon.validate" . }}
{{- $v := .Values }}
{{- $s := $v.sidecar }}
{{- $grpc := int $s.ports.grpc }}
{{- $admin := int $s.ports.admin }}
{{- $probe := include "anarchon.probeType" . }}
{{- $preStop := int (include "anarchon.preStopSleepSeconds" .) -}}
- name: {{ $s.name }}
  image: {{ include "anarchon.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if $s.native }}
  # A native sidecar: started before the app's containers, stopped after them.
  restartPolicy: Always
  {{- end }}
  args:
    - serve
    - --config=/etc/anarchon/config/anarchon.toml
    {{- range $k := keys $s.labels | sortAlpha }}
    - --label={{ $k }}={{ index $s.labels $k }}
    {{- end }}
    {{- with $v.secrets.meshSecret.name }}
    - --mesh-secret-file=/etc/anarchon/secrets/mesh-secret
    {{- end }}
    {{- with $v.secrets.authToken.name }}
    - --auth-token-file=/etc/anarchon/secrets/auth-token
    {{- end }}
    {{- if $v.secrets.tls.name }}
    - --tls-cert=/etc/anarchon/secrets/tls.crt
    - --tls-key=/etc/anarchon/secrets/tls.key
    {{- if $v.secrets.tls.caKey }}
    - --tls-client-ca=/etc/anarchon/secrets/ca.crt
    {{- end }}
    {{- end }}
    {{- range $s.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    # The downward API: the pod's IP is the address peers dial.
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: ANARCHON_LISTEN
      value: {{ printf "%s:%d" $s.listenHost $grpc | quote }}
    - name: ANARCHON_ADMIN_LISTEN
      value: {{ printf "%s:%d" $s.listenHost $admin | quote }}
    - name: ANARCHON_DATA_DIR
      value: {{ $s.dataDir | quote }}
    - name: ANARCHON_ADVERTISE
      value: {{ $s.advertise | default (printf "$(POD_IP):%d" $grpc) | quote }}
    {{- if $s.unixSocket.enabled }}
    # Applications in the pod may dial this socket instead of the gRPC port.
    - name: ANARCHON_LISTEN_UNIX
      value: {{ include "anarchon.unixSocketPath" . | quote }}
    - name: ANARCHON_LISTEN_UNIX_GROUP
      value: {{ $s.unixSocket.group | quote }}
    {{- end }}
    {{- if $v.backend.urlSecret.name }}
    - name: ANARCHON_BACKEND
      valueFrom:
        secretKeyRef:
          name: {{ $v.backend.urlSecret.name }}
          key: {{ $v.backend.urlSecret.key }}
    {{- else if $v.backend.passwordSecret.name }}
    - name: BACKEND_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ $v.backend.passwordSecret.name }}
          key: {{ $v.backend.passwordSecret.key }}
    - name: ANARCHON_BACKEND
      value: {{ $v.backend.url | quote }}
    {{- end }}
    {{- with $v.secrets.authToken.name }}
    # Read by the anarchon client too: `kubectl exec … anarchon peers`.
    - name: ANARCHON_AUTH_TOKEN_FILE
      value: /etc/anarchon/secrets/auth-token
    {{- end }}
    {{- with $s.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: {{ $s.portNames.grpc }}
      containerPort: {{ $grpc }}
      protocol: TCP
    - name: {{ $s.portNames.admin }}
      containerPort: {{ $admin }}
      protocol: TCP
  {{- range $kind := list "startup" "readiness" "liveness" }}
  {{- $p := index $s.probes $kind }}
  {{ $kind }}Probe:
    {{- if eq $probe "grpc" }}
    grpc:
      port: {{ $grpc }}
    {{- else }}
    httpGet:
      path: {{ ternary "/readyz" "/healthz" (eq $kind "readiness") }}
      port: {{ $admin }}
    {{- end }}
    periodSeconds: {{ int $p.periodSeconds }}
    failureThreshold: {{ int $p.failureThreshold }}
    timeoutSeconds: {{ int $p.timeoutSeconds }}
  {{- end }}
  {{- if gt $preStop 0 }}
  lifecycle:
    # No shell in the image: the kubelet sleeps, then sends SIGTERM (LEFT
    # mark, held leases ended, drain for up to drain_ms).
    preStop:
      sleep:
        seconds: {{ $preStop }}
  {{- end }}
  {{- with $s.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $s.securityContext | nindent 4 }}
  volumeMounts:
    - name: anarchon-config
      mountPath: /etc/anarchon/config
      readOnly: true
    - name: anarchon-data
      mountPath: {{ $s.dataDir }}
    - name: anarchon-tmp
      mountPath: /tmp
    {{- if $s.unixSocket.enabled }}
    - name: anarchon-socket
      mountPath: {{ $s.unixSocket.dir }}
    {{- end }}
    {{- if include "anarchon.hasSecrets" . }}
    - name: anarchon-secrets
      mountPath: /etc/anarchon/secrets
      readOnly: true
    {{- end }}
    {{- with $s.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{- define "anarchon.hasSecrets" -}}
{{- if or .Values.secrets.meshSecret.name .Values.secrets.authToken.name .Values.secrets.tls.name }}true{{ end }}
{{- end }}

{{- define "anarchon.volumes" -}}
{{- $v := .Values -}}
- name: anarchon-config
  configMap:
    name: {{ include "anarchon.configMapName" . }}
- name: anarchon-data
  {{- toYaml $v.sidecar.dataVolume | nindent 2 }}
- name: anarchon-tmp
  emptyDir:
    sizeLimit: {{ $v.sidecar.tmpSizeLimit }}
{{- if $v.sidecar.unixSocket.enabled }}
# The sidecar's Unix socket (sidecar.unixSocket); mount it in the app's
# containers at the same path.
- name: anarchon-socket
  emptyDir:
    sizeLimit: 1Mi
{{- end }}
{{- if include "anarchon.hasSecrets" . }}
- name: anarchon-secrets
  projected:
    defaultMode: {{ int $v.secrets.fileMode }}
    sources:
      {{- with $v.secrets.meshSecret.name }}
      - secret:
          name: {{ . }}
          items:
            - key: {{ $v.secrets.meshSecret.key }}
              path: mesh-secret
      {{- end }}
      {{- with $v.secrets.authToken.name }}
      - secret:
          name: {{ . }}
          items:
            - key: {{ $v.secrets.authToken.key }}
              path: auth-token
      {{- end }}
      {{- with $v.secrets.tls.name }}
      - secret:
          name: {{ . }}
          items:
            - key: {{ $v.secrets.tls.certKey }}
              path: tls.crt
            - key: {{ $v.secrets.tls.keyKey }}
              path: tls.key
            {{- if $v.secrets.tls.caKey }}
            - key: {{ $v.secrets.tls.caKey }}
              path: ca.crt
            {{- end }}
      {{- end }}
{{- end }}
{{- end }}
