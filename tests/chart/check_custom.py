#!/usr/bin/env python3
"""Checks `helm template` with tests/chart/values-custom.yaml: every value there shows up where it
should, and what it turns off is gone.

    check_custom.py RENDERED.yaml
"""
import sys

from checks import check, finish, rendered

objs, _ = rendered(sys.argv[1])
by_kind = {}
for o in objs:
    by_kind.setdefault(o["kind"], []).append(o)


def one(kind, name):
    found = [o for o in by_kind.get(kind, []) if o["metadata"]["name"] == name]
    return found[0] if len(found) == 1 else None


ds = one("DaemonSet", "stickyvol-node")
sts = one("StatefulSet", "stickyvol-controller")
check(ds is not None and sts is not None, "the DaemonSet and the StatefulSet are rendered")
pod = ds["spec"]["template"]["spec"]
containers = {c["name"]: c for c in pod["containers"]}
doctor = pod["initContainers"][0]
serve = containers["stickyvol"]
env = {e["name"]: e for e in serve["env"]}

# image
for where, c in (("node", doctor), ("node", serve), ("controller", sts["spec"]["template"]["spec"]["containers"][0])):
    check(c["image"] == "registry.example.com/stickyvol:dev" and c["imagePullPolicy"] == "Always",
          f"{where} {c['name']}: image and pull policy from values")

# pools
pools = "nvme=/mnt/nvme/stickyvol,inside=/var/lib/kubelet/stickyvol-inside"
optional = "ssd=/mnt/disks/ssd/stickyvol,hdd=/mnt/disks/hdd/stickyvol"
for c in (doctor, serve):
    cenv = {e["name"]: e.get("value") for e in c["env"]}
    check(cenv.get("POOLS") == pools and cenv.get("OPTIONAL_POOLS") == optional,
          f"{c['name']}: POOLS and OPTIONAL_POOLS")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    check(mounts.get("/mnt/nvme/stickyvol", {}).get("mountPropagation") == "Bidirectional",
          f"{c['name']}: the pool nvme mounted at its path, Bidirectional")
    check(mounts.get("/mnt/disks", {}).get("mountPropagation") == "Bidirectional",
          f"{c['name']}: the optional pools' /mnt/disks mounted, Bidirectional")
    check(not any(p.startswith("/var/lib/kubelet/") for p in mounts),
          f"{c['name']}: no mount nested in /var/lib/kubelet for the pool inside it")
    check(len(c["volumeMounts"]) == len(mounts), f"{c['name']}: no path mounted twice")
    check(not any("pool" in a for a in c["args"]), f"{c['name']}: no pool flags (the variables say it)")
check(not ({"ENFORCEMENT", "OVERCOMMIT", "KUBELET_EVICTION_RESERVE"} & {e["name"] for e in doctor["env"]}),
      "doctor: no ENFORCEMENT/OVERCOMMIT/KUBELET_EVICTION_RESERVE (serve's flags only)")
check(env.get("KUBELET_EVICTION_RESERVE", {}).get("value") == "0",
      "stickyvol: KUBELET_EVICTION_RESERVE 0 (an explicit 0 is rendered, not dropped)")
check(env.get("ENFORCEMENT", {}).get("value") == "default=none,nvme=project"
      and env.get("OVERCOMMIT", {}).get("value") == "nvme=1.5",
      "stickyvol: ENFORCEMENT per pool and OVERCOMMIT")
vols = {v["name"]: v for v in pod["volumes"]}
check(vols.get("pool-nvme", {}).get("hostPath") == {"path": "/mnt/nvme/stickyvol", "type": "Directory"},
      "volume pool-nvme: hostPath of type Directory")
disks = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/mnt/disks"]
check(len(disks) == 1 and disks[0]["hostPath"]["type"] == "DirectoryOrCreate",
      "one volume for /mnt/disks (two optional pools share it), DirectoryOrCreate")
mount_names = {m["name"] for c in (doctor, serve) for m in c["volumeMounts"]}
check(mount_names <= set(vols), "every mount names a volume")

# snapshots off
check("csi-snapshotter" not in containers, "snapshots off: no csi-snapshotter container")
check(one("ClusterRole", "stickyvol-snapshotter") is None
      and one("ClusterRoleBinding", "stickyvol-snapshotter") is None,
      "snapshots off: no snapshotter ClusterRole/Binding")
check("VolumeSnapshotClass" not in by_kind, "snapshots off: no VolumeSnapshotClass (even with create: true)")
check(one("ClusterRole", "stickyvol-provisioner") is not None, "the provisioner's ClusterRole stays")

# metrics off
for name, c in (("node", serve), ("controller", sts["spec"]["template"]["spec"]["containers"][0])):
    check(not any(a.startswith("--metrics-address") for a in c["args"]), f"metrics off: {name} has no --metrics-address")
    check("metrics" not in {p["name"] for p in c["ports"]}, f"metrics off: {name} has no metrics port")
    # The node plugin keeps POD_IP for its transfer address.
    check(("POD_IP" in {e["name"] for e in c["env"]}) == (name == "node"),
          f"metrics off: {name} has POD_IP only for transfers")

# logs
check(env["RUST_LOG"]["value"] == "debug" and env["LOG_FORMAT"]["value"] == "json", "log level and format")

# node selector, tolerations, resources
check(pod["nodeSelector"] == {"kubernetes.io/os": "linux", "stickyvol.example/disk": "yes"},
      "DaemonSet nodeSelector: the default merged with the one given")
check(pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule"}],
      "DaemonSet tolerations replaced")
check(sts["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"},
      "the controller's nodeSelector is its own")
check(serve["resources"] == {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"cpu": "2", "memory": "512Mi"}},
      "stickyvol container resources from values")
check(containers["csi-provisioner"]["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"},
      "other containers keep their resources")

# StorageClass
scs = by_kind.get("StorageClass", [])
check(len(scs) == 1 and scs[0]["metadata"]["name"] == "local-sticky", "StorageClass renamed")
sc = scs[0]
check(sc["metadata"].get("annotations") == {"storageclass.kubernetes.io/is-default-class": "true"},
      "StorageClass: default-class annotation")
check(sc.get("parameters") == {"pool": "nvme", "requireEnforcement": "true"}, "StorageClass parameters")

finish("custom-values")
