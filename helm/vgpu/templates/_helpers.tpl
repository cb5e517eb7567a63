{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "vgpu.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix for every object: the release name, with the chart name unless it already contains it. */}}
{{- define "vgpu.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "vgpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "vgpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: call with (list $ "webhook"). */}}
{{- define "vgpu.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "vgpu.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Image reference: call with (list $ .Values.webhook.image). The image's own registry wins over
global.imageRegistry; the tag defaults to the chart's appVersion. */}}
{{- define "vgpu.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $tag := default $root.Chart.AppVersion $img.tag -}}
{{- $registry := default $root.Values.global.imageRegistry $img.registry -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" $registry $img.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* kube-scheduler tag: the value, else the cluster's version without any vendor suffix. */}}
{{- define "vgpu.kubeSchedulerTag" -}}
{{- if .Values.scheduler.kubeScheduler.imageTag -}}
{{- .Values.scheduler.kubeScheduler.imageTag -}}
{{- else -}}
{{- regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- end -}}

{{- define "vgpu.webhookService" -}}{{ include "vgpu.fullname" . }}-webhook{{- end -}}
{{- define "vgpu.webhookTlsSecret" -}}{{ .Values.certs.secretName }}{{- end -}}
{{- define "vgpu.schedulerService" -}}{{ include "vgpu.fullname" . }}-scheduler{{- end -}}
{{- define "vgpu.schedulerTlsSecret" -}}{{ .Values.scheduler.extender.tls.secretName | default (printf "%s-scheduler-tls" (include "vgpu.fullname" .)) }}{{- end -}}
{{- define "vgpu.mutatingName" -}}{{ include "vgpu.fullname" . }}-mutate{{- end -}}
{{- define "vgpu.validatingName" -}}{{ include "vgpu.fullname" . }}-validate{{- end -}}

{{/* CEL: true when any container or init container asks for a vGPU resource (limits or requests). */}}
{{- define "vgpu.requestsVgpu" -}}
{{- $names := list .Values.resourceName .Values.resourceMem .Values.resourceMemPercentage .Values.resourceCores -}}
{{- $quoted := list -}}
{{- range $names }}{{ $quoted = append $quoted (printf "'%s'" .) }}{{ end -}}
(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c, has(c.resources) && [{{ join ", " $quoted }}].exists(r, (has(c.resources.limits) && r in c.resources.limits) || (has(c.resources.requests) && r in c.resources.requests)))
{{- end -}}

{{/* caBundle for the webhook configurations, by certs.mode. */}}
{{- define "vgpu.caBundle" -}}
{{- if eq .Values.certs.mode "provided" -}}
{{- required "certs.caBundle (base64 PEM) is required when certs.mode=provided" .Values.certs.caBundle -}}
{{- else if eq .Values.certs.mode "job" -}}
{{- /* On upgrade, keep the CA the Job made (the post-upgrade Job re-injects it anyway). */ -}}
{{- $s := lookup "v1" "Secret" .Release.Namespace .Values.certs.secretName -}}
{{- if and $s $s.data -}}{{- index $s.data "ca.crt" | default "" -}}{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vgpu.checkValues" -}}
{{- if not (has .Values.certs.mode (list "job" "cert-manager" "provided")) -}}
{{- fail (printf "certs.mode must be job, cert-manager or provided, not %q" .Values.certs.mode) -}}
{{- end -}}
{{- if lt (int .Values.devicePlugin.deviceSplitCount) 1 -}}
{{- fail "devicePlugin.deviceSplitCount must be at least 1" -}}
{{- end -}}
{{- if gt (int .Values.devicePlugin.deviceSplitCount) 1000 -}}
{{- fail "devicePlugin.deviceSplitCount must be at most 1000" -}}
{{- end -}}
{{- if le (float64 .Values.devicePlugin.deviceMemoryScaling) 0.0 -}}
{{- fail "devicePlugin.deviceMemoryScaling must be a positive number" -}}
{{- end -}}
{{- if not (has .Values.devicePlugin.backend (list "nvidia" "dcu")) -}}
{{- fail (printf "devicePlugin.backend must be nvidia or dcu, not %q" .Values.devicePlugin.backend) -}}
{{- end -}}
{{- $policies := list "binpack" "spread" "fragmentation" "gap-aware" -}}
{{- range $key, $p := dict "nodePolicy" .Values.scheduler.extender.nodePolicy "gpuPolicy" .Values.scheduler.extender.gpuPolicy -}}
{{- if not (has $p $policies) -}}
{{- fail (printf "scheduler.extender.%s must be one of %s, not %q" $key (join ", " $policies) $p) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "bool" .Values.scheduler.extender.chooseNode) -}}
{{- fail (printf "scheduler.extender.chooseNode must be true or false, not %v" .Values.scheduler.extender.chooseNode) -}}
{{- end -}}
{{- $p := .Values.scheduler.percentageOfNodesToScore -}}
{{- if or (not (regexMatch "^[0-9]+$" (toString $p))) (gt (int $p) 100) -}}
{{- fail (printf "scheduler.percentageOfNodesToScore must be a whole number from 0 (kube-scheduler's adaptive default) to 100, not %v" $p) -}}
{{- end -}}
{{- range $key := list "headerReadTimeout" "bodyReadTimeout" "idleTimeout" -}}
{{- $v := toString (index $.Values.webhook $key) -}}
{{- if or (not (regexMatch "^[0-9]+(ms|s|m)?$" $v)) (regexMatch "^0+(ms|s|m)?$" $v) -}}
{{- fail (printf "webhook.%s must be a positive whole number of ms, s or m (like 10s), not %q" $key $v) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.dra.enabled (semverCompare "<1.34-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "dra.enabled needs Kubernetes 1.34 or newer (resource.k8s.io/v1), not %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if not (regexMatch "^[0-9]+[dhms]$" (toString .Values.certs.renewBefore)) -}}
{{- fail (printf "certs.renewBefore must be a whole number of d, h, m or s (like 30d), not %q" (toString .Values.certs.renewBefore)) -}}
{{- end -}}
{{- end -}}

{{/* Pod of the renew/inject Job and CronJob: generate (renews if due) then inject the CA. */}}
{{- define "vgpu.certsPod" -}}
{{- $root := index . 0 -}}
{{- $outer := . -}}
spec:
  serviceAccountName: {{ index . 1 }}
  # Never: failed attempts stay as pods whose logs say why (see the generate Job).
  restartPolicy: Never
  {{- with $root.Values.global.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml (index . 5) | nindent 4 }}
  initContainers:
    - name: generate
      image: {{ index . 2 }}
      imagePullPolicy: {{ $root.Values.imagePullPolicy }}
      args:
        {{- toYaml (index . 3) | nindent 8 }}
      securityContext:
        {{- toYaml (index . 6) | nindent 8 }}
      volumeMounts:
        - {name: certs, mountPath: /certs}
    {{- with (index . 7) }}
    - name: generate-scheduler
      image: {{ index $outer 2 }}
      imagePullPolicy: {{ $root.Values.imagePullPolicy }}
      args:
        {{- toYaml . | nindent 8 }}
      securityContext:
        {{- toYaml (index $outer 6) | nindent 8 }}
      volumeMounts:
        - {name: scheduler-certs, mountPath: /scheduler-certs}
    {{- end }}
  containers:
    - name: inject
      image: {{ index . 2 }}
      imagePullPolicy: {{ $root.Values.imagePullPolicy }}
      args:
        {{- toYaml (index . 4) | nindent 8 }}
      securityContext:
        {{- toYaml (index . 6) | nindent 8 }}
      volumeMounts:
        - {name: certs, mountPath: /certs, readOnly: true}
  volumes:
    - {name: certs, emptyDir: {medium: Memory}}
    {{- if index . 7 }}
    - {name: scheduler-certs, emptyDir: {medium: Memory}}
    {{- end }}
{{- end -}}

{{/* CEL: a ResourceClaim or ResourceClaimTemplate with a request (or firstAvailable
alternative) of DeviceClass gpu.vgpu.io. */}}
{{- define "vgpu.asksDraClass" -}}
[object.kind == 'ResourceClaimTemplate' ? object.spec.spec : object.spec].exists(s, has(s.devices) && has(s.devices.requests) && s.devices.requests.exists(r, (has(r.exactly) && r.exactly.deviceClassName == 'gpu.vgpu.io') || (has(r.firstAvailable) && r.firstAvailable.exists(a, a.deviceClassName == 'gpu.vgpu.io'))))
{{- end -}}
