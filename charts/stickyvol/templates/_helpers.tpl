{{/* The namespace of every namespaced object: namespace.name, else the release's. */}}
{{- define "stickyvol.namespace" -}}
{{ .Values.namespace.name | default .Release.Namespace }}
{{- end }}

{{/* Labels of every object's metadata. */}}
{{- define "stickyvol.labels" -}}
app.kubernetes.io/part-of: stickyvol
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Annotations for annotation-based scraping (metrics.scrapeAnnotations), or nothing. */}}
{{- define "stickyvol.scrapeAnnotations" -}}
{{- if and .Values.metrics.enabled .Values.metrics.scrapeAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* The driver image: by digest when one is given (the tag then only names it). */}}
{{- define "stickyvol.image" -}}
{{- if .Values.image.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .Values.image.digest) }}
{{- fail (printf "image.digest: %q is not sha256: and 64 hex digits" .Values.image.digest) }}
{{- end -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* kubelet's root directory on the nodes, without a trailing slash, checked. */}}
{{- define "stickyvol.kubeletDir" -}}
{{- $dir := trimSuffix "/" .Values.kubeletDir }}
{{- if or (not (hasPrefix "/" $dir)) (contains "," $dir) (contains ".." $dir) (eq $dir "") }}
{{- fail (printf "kubeletDir: %q must be an absolute path without a comma or .." .Values.kubeletDir) }}
{{- end }}
{{- $dir }}
{{- end }}

{{/* The data directory (the pool "default"): serve's own default for this driver name. */}}
{{- define "stickyvol.dataDir" -}}
{{ include "stickyvol.kubeletDir" . }}/volumes/{{ .Values.driverName }}
{{- end }}

{{/* A pod template's extra labels and annotations (node.podLabels, controller.podAnnotations,
...): $ is the component's values. Selector labels cannot be overridden. */}}
{{- define "stickyvol.podLabels" -}}
{{- range $key, $value := .podLabels }}
{{- if or (eq $key "app.kubernetes.io/name") (eq $key "app.kubernetes.io/component") }}
{{- fail (printf "podLabels: %s is a selector label of the chart's own" $key) }}
{{- end }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* Whether the csi-snapshotter sidecar and its RBAC are rendered ("true" or ""). */}}
{{- define "stickyvol.snapshotter" -}}
{{- if .Values.snapshots.enabled }}true{{ end }}
{{- end }}

{{/* Whether the VolumeSnapshotClass is rendered ("true" or ""). */}}
{{- define "stickyvol.volumeSnapshotClass" -}}
{{- $c := .Values.snapshots.volumeSnapshotClass }}
{{- if .Values.snapshots.enabled }}
{{- if eq (toString $c.create) "auto" }}
{{- if .Capabilities.APIVersions.Has "snapshot.storage.k8s.io/v1/VolumeSnapshotClass" }}true{{ end }}
{{- else if eq (toString $c.create) "true" }}true
{{- else if ne (toString $c.create) "false" }}
{{- fail (printf "snapshots.volumeSnapshotClass.create must be auto, true or false, not %v" $c.create) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The pools, as environment variables rather than flags (serve and doctor read the same ones), so
that `kubectl exec … -c stickyvol -- stickyvol doctor` and the admin commands see them too.
Names and paths are checked here as serve checks them, so a mistake fails at render time, not in
a crash loop.
*/}}
{{- define "stickyvol.poolEnv" -}}
{{- $pools := list }}
{{- range .Values.pools }}
{{- include "stickyvol.checkPool" . }}
{{- $pools = append $pools (printf "%s=%s" .name .path) }}
{{- end }}
{{- $optional := list }}
{{- range .Values.optionalPools }}
{{- include "stickyvol.checkPool" . }}
{{- $optional = append $optional (printf "%s=%s" .name .path) }}
{{- end }}
{{- with $pools }}
- name: POOLS
  value: {{ join "," . | quote }}
{{- end }}
{{- with $optional }}
- name: OPTIONAL_POOLS
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}

{{- define "stickyvol.checkPool" -}}
{{- if not (regexMatch "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$" (toString .name)) }}
{{- fail (printf "pool name %q: 1 to 63 characters of [a-z0-9-], alphanumeric at both ends" (toString .name)) }}
{{- end }}
{{- if not (hasPrefix "/" (toString .path)) }}
{{- fail (printf "pool %s: path %q must be absolute" .name (toString .path)) }}
{{- end }}
{{- if contains "," (toString .path) }}
{{- fail (printf "pool %s: path %q has a comma (the variables are comma-separated lists)" .name (toString .path)) }}
{{- end }}
{{- end }}

{{/* ENFORCEMENT, OVERCOMMIT and KUBELET_EVICTION_RESERVE, serve only (doctor has no such flags). */}}
{{- define "stickyvol.poolTuningEnv" -}}
{{- $enforcement := list }}
{{- range $name, $mode := .Values.enforcement }}
{{- if not (has (toString $mode) (list "auto" "btrfs" "project" "none")) }}
{{- fail (printf "enforcement.%s: %q is not auto, btrfs, project or none" $name (toString $mode)) }}
{{- end }}
{{- $enforcement = append $enforcement (printf "%s=%v" $name $mode) }}
{{- end }}
{{- $overcommit := list }}
{{- range $name, $ratio := .Values.overcommit }}
{{- if not (and (regexMatch "^[0-9]+(\\.[0-9]+)?$" (toString $ratio)) (ge (float64 $ratio) 1.0)) }}
{{- fail (printf "overcommit.%s: %q is not a ratio of at least 1" $name (toString $ratio)) }}
{{- end }}
{{- $overcommit = append $overcommit (printf "%s=%v" $name $ratio) }}
{{- end }}
{{- with $enforcement }}
- name: ENFORCEMENT
  value: {{ join "," . | quote }}
{{- end }}
{{- with $overcommit }}
- name: OVERCOMMIT
  value: {{ join "," . | quote }}
{{- end }}
{{- $reserve := .Values.kubeletEvictionReserve }}
{{- if not (kindIs "invalid" $reserve) }}
{{- if not (regexMatch "^([0-9]|[1-4][0-9]|50)$" (toString $reserve)) }}
{{- fail (printf "kubeletEvictionReserve: %q is not a whole percent from 0 to 50" (toString $reserve)) }}
{{- end }}
- name: KUBELET_EVICTION_RESERVE
  value: {{ toString $reserve | quote }}
{{- end }}
{{- end }}

{{/*
The host directories the pools need mounted, as a JSON list of {name, path, type}: one per
distinct directory, none for a directory under the kubelet directory (already mounted whole).
*/}}
{{- define "stickyvol.poolVolumes" -}}
{{- $kubelet := printf "%s/" (include "stickyvol.kubeletDir" .) }}
{{- $seen := dict }}
{{- $out := list }}
{{- range .Values.pools }}
{{- $host := .hostPath | default .path }}
{{- if and .hostPath (not (hasPrefix (printf "%s/" (trimSuffix "/" $host)) .path)) (ne (trimSuffix "/" $host) (trimSuffix "/" .path)) }}
{{- fail (printf "pools: %s: path %s is not inside hostPath %s" .name .path $host) }}
{{- end }}
{{- if and (not (hasPrefix $kubelet $host)) (not (hasKey $seen $host)) }}
{{- $_ := set $seen $host true }}
{{- $out = append $out (dict "name" (printf "pool-%s" .name) "path" $host "type" "Directory") }}
{{- end }}
{{- end }}
{{- range .Values.optionalPools }}
{{- $host := required (printf "optionalPools: %s needs hostPath (the directory that holds its path, e.g. where disks are mounted)" .name) .hostPath }}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" $host)) .path) }}
{{- fail (printf "optionalPools: %s: path %s is not inside hostPath %s" .name .path $host) }}
{{- end }}
{{- if and (not (hasPrefix $kubelet $host)) (not (hasKey $seen $host)) }}
{{- $_ := set $seen $host true }}
{{- $out = append $out (dict "name" (printf "optional-pool-%s" .name) "path" $host "type" "DirectoryOrCreate") }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* volumeMounts for the pools' host directories. */}}
{{- define "stickyvol.poolMounts" -}}
{{- range (include "stickyvol.poolVolumes" . | fromJsonArray) }}
- name: {{ .name }}
  mountPath: {{ .path }}
  mountPropagation: Bidirectional
{{- end }}
{{- end }}
