# What the pod spec and the class ask of a mount: the pod's fsGroup is applied to the volume,
# a readOnly volume refuses writes, and the class's mountOptions reach the bind mount.
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"

k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: e2e-noexec}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
mountOptions: [noexec, nosuid]
YAML
defer 'k delete storageclass e2e-noexec --ignore-not-found >/dev/null'

claim grouped 1Gi
claim opts 1Gi e2e-noexec
apply <<YAML
apiVersion: v1
kind: Pod
metadata: {name: grouped}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2345}
  containers:
  - name: app
    image: $TEST_IMAGE
    command: [sh, -c, "touch /data/mine && sleep 100000"]
    volumeMounts: [{name: data, mountPath: /data}, {name: opts, mountPath: /opts}]
  volumes:
  - {name: data, persistentVolumeClaim: {claimName: grouped}}
  - {name: opts, persistentVolumeClaim: {claimName: opts}}
YAML
wait_pod_running grouped

step "fsGroup"
expect_eq "$(pexec grouped stat -c %g /data)" 2345 "the volume root's group"
expect_eq "$(pexec grouped stat -c %g /data/mine)" 2345 "a new file's group (setgid directory)"

# A second pod on the same node (ReadWriteOnce allows it) mounts the claim readOnly. Not the
# same pod: kubelet mounts a claim once per pod, so a pod naming it twice, once readOnly, gets
# one mount, read-only (an earlier version of this scenario did that, and its failure was
# reported as a pass).
step "readOnly"
kn apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  nodeSelector: {kubernetes.io/hostname: $(pod_node grouped)}
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2345}
  containers:
  - name: app
    image: $TEST_IMAGE
    command: [sh, -c, "sleep 100000"]
    volumeMounts: [{name: ro, mountPath: /ro, readOnly: true}]
  volumes:
  - {name: ro, persistentVolumeClaim: {claimName: grouped, readOnly: true}}
YAML
wait_pod_running reader
expect_eq "$(pexec reader stat -c %g /ro/mine)" 2345 "the file the other pod wrote, as the reader sees it"
if pexec reader touch /ro/nope 2>/dev/null; then fail "a write into the readOnly mount succeeded"; fi
pexec reader grep -q ' /ro .*\bro\b' /proc/self/mountinfo || fail "/ro is not mounted read-only"
pexec grouped touch /data/still-writable || fail "the read-write mount became read-only"

step "mountOptions from the class"
opts=$(pexec grouped awk '$5 == "/opts" {print $6}' /proc/self/mountinfo)
[[ ,$opts, == *,noexec,* && ,$opts, == *,nosuid,* ]] || fail "/opts mounted with '$opts', not noexec,nosuid"
pexec grouped sh -c 'cp /bin/busybox /opts/bb && chmod +x /opts/bb'
if pexec grouped /opts/bb true 2>/dev/null; then fail "a program ran from the noexec volume"; fi
