#!/usr/bin/env python3
"""Checks `helm template` with tests/chart/values-knobs.yaml: each deployment knob shows up where
it should (both pods, every host path under the kubelet directory), and nothing of the default
kubelet directory is left.

    check_knobs.py RENDERED.yaml
"""
import sys

from checks import check, finish, rendered

objs, text = rendered(sys.argv[1])
named = {(o["kind"], o["metadata"]["name"]): o for o in objs}
ds = named[("DaemonSet", "stickyvol-node")]
sts = named[("StatefulSet", "stickyvol-controller")]
KUBELET = "/var/lib/k0s/kubelet"
DIGEST = "ghcr.io/stickyvol/stickyvol@sha256:" + "0123456789abcdef" * 4

for workload, name in ((ds, "node"), (sts, "controller")):
    template = workload["spec"]["template"]
    pod = template["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    ours = containers["stickyvol"]
    check(pod.get("imagePullSecrets") == [{"name": "registry-credentials"}], f"{name}: imagePullSecrets")
    check(template["metadata"]["labels"].get("team") == "storage", f"{name}: podLabels")
    check(
        workload["spec"]["selector"]["matchLabels"].get("team") is None,
        f"{name}: podLabels stay out of the selector",
    )
    check(
        template["metadata"]["annotations"].get("example.com/owner") == "storage-team"
        and "kubectl.kubernetes.io/default-container" in template["metadata"]["annotations"],
        f"{name}: podAnnotations, beside the chart's own",
    )
    check("affinity" in pod, f"{name}: affinity")
    check(ours["image"] == DIGEST, f"{name}: the driver image by digest")
    check({"name": "EXAMPLE", "value": "1" if name == "node" else "2"} in ours["env"], f"{name}: extraEnv")

serve = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}["stickyvol"]
check(serve["args"][-1] == "--max-volumes-per-node=200", "node: extraArgs after the chart's own")
controller = {c["name"]: c for c in sts["spec"]["template"]["spec"]["containers"]}["stickyvol"]
check(controller["args"][-1] == "--check-classes=off", "controller: extraArgs after the chart's own")
check(
    ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
    "node: updateStrategy",
)
doctor = ds["spec"]["template"]["spec"]["initContainers"][0]
for container in (doctor, serve):
    check(f"--kubelet-dir={KUBELET}" in container["args"], f"{container['name']}: --kubelet-dir")
    check(f"--data-dir={KUBELET}/volumes/stickyvol.csi.io" in container["args"], f"{container['name']}: --data-dir")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    check(mounts["kubelet-dir"]["mountPath"] == KUBELET, f"{container['name']}: the kubelet directory at its own path")
registrar = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}["node-driver-registrar"]
check(
    f"--kubelet-registration-path={KUBELET}/plugins/stickyvol.csi.io/csi.sock" in registrar["args"],
    "node-driver-registrar: the registration path",
)
host_paths = [v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
check(
    {KUBELET, f"{KUBELET}/plugins/stickyvol.csi.io", f"{KUBELET}/plugins_registry"} <= set(host_paths),
    "the DaemonSet's host paths follow kubeletDir",
)
check("/var/lib/kubelet" not in text.replace("# ", ""), "nothing renders /var/lib/kubelet")

classes = {o["metadata"]["name"]: o for o in objs if o["kind"] == "StorageClass"}
check(set(classes) == {"stickyvol", "stickyvol-nvme", "stickyvol-ext4"}, "the StorageClass and both extra classes")
nvme, ext4 = classes["stickyvol-nvme"], classes["stickyvol-ext4"]
check(
    nvme["parameters"] == {"pool": "nvme"} and nvme["reclaimPolicy"] == "Delete"
    and nvme["allowVolumeExpansion"] is True and "annotations" not in nvme["metadata"],
    "an extra class with only a name and parameters gets the defaults",
)
check(
    ext4["reclaimPolicy"] == "Retain" and ext4["allowVolumeExpansion"] is False
    and ext4["mountOptions"] == ["noatime"]
    and ext4["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"},
    "an extra class's own values, false included",
)
for cls in classes.values():
    check(cls["volumeBindingMode"] == "WaitForFirstConsumer", f"{cls['metadata']['name']}: WaitForFirstConsumer")

# securityContext overrides, merged with the defaults (a null removes a key); the node plugin's
# own containers stay privileged whatever is set.
sts_pod = sts["spec"]["template"]["spec"]
check(
    sts_pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "controller: podSecurityContext merged, runAsUser and runAsGroup removed",
)
check(
    {c["name"]: c for c in sts_pod["containers"]}["stickyvol"]["securityContext"].get("privileged") is False,
    "controller: the stickyvol container's securityContext",
)
sidecars = [
    c
    for pod in (ds["spec"]["template"]["spec"], sts_pod)
    for c in pod["containers"]
    if c["name"] != "stickyvol"
]
check(len(sidecars) == 6, f"six sidecar containers, found {len(sidecars)}")
for c in sidecars:
    sc = c.get("securityContext", {})
    check(
        sc.get("runAsNonRoot") is True and sc.get("readOnlyRootFilesystem") is True,
        f"{c['name']}: sidecars.securityContext merged with the default",
    )
for c in ds["spec"]["template"]["spec"]["initContainers"] + ds["spec"]["template"]["spec"]["containers"]:
    if c["name"] in ("stickyvol", "doctor"):
        check(c["securityContext"].get("privileged") is True, f"node {c['name']}: still privileged")

finish("deployment-knob")
