//! Objects shaped like a real cluster's: Nodes of about 11 KB of JSON (labels, annotations,
//! conditions, addresses, 40 images), PVs as external-provisioner writes them for our driver,
//! and the few StatefulSets, claims and pods the reaction times are measured on.

use serde_json::{Value, json};

pub const DRIVER: &str = "stickyvol.csi.io";
pub const TOPOLOGY_KEY: &str = "topology.stickyvol.csi.io/node";
pub const CLASS: &str = "stickyvol-release";
pub const NAMESPACE: &str = "sim";
const CREATED: &str = "2026-11-01T08:00:00Z";

pub fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn condition(kind: &str, status: &str, reason: &str, heartbeat: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason,
           "message": format!("kubelet reports {kind} is {status}"),
           "lastHeartbeatTime": heartbeat, "lastTransitionTime": CREATED})
}

fn images(i: usize) -> Vec<Value> {
    (0..40)
        .map(|k| {
            let repo = format!("registry.example.com/team-{}/service-{k:02}", k % 7);
            json!({"names": [
                format!("{repo}@sha256:{:064x}", (i as u128 + 1) * 7919 + k as u128),
                format!("{repo}:v1.{k}.{}", i % 13)],
                "sizeBytes": 50_000_000 + k * 1_234_567})
        })
        .collect()
}

/// Node `i`, Ready, its last heartbeat at `heartbeat`.
pub fn node(i: usize, heartbeat: &str) -> Value {
    let name = node_name(i);
    let conditions = vec![
        condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            heartbeat,
        ),
        condition(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            heartbeat,
        ),
        condition("PIDPressure", "False", "KubeletHasSufficientPID", heartbeat),
        condition("Ready", "True", "KubeletReady", heartbeat),
    ];
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("00000000-0000-4000-8000-{i:012}"),
            "creationTimestamp": CREATED,
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m6i.2xlarge",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": format!("eu-west-1{}", ["a", "b", "c"][i % 3]),
                TOPOLOGY_KEY: name,
            },
            "annotations": {
                "csi.volume.kubernetes.io/nodeid": format!("{{\"{DRIVER}\":\"{name}\"}}"),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256),
                 "providerID": format!("aws:///eu-west-1a/i-{i:017x}")},
        "status": {
            "capacity": {"cpu": "8", "memory": "32386512Ki", "pods": "110",
                         "ephemeral-storage": "203070420Ki", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "7910m", "memory": "31369680Ki", "pods": "110",
                            "ephemeral-storage": "187149698763", "hugepages-2Mi": "0"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 256, i % 256)},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"),
                         "bootID": format!("{i:032x}"), "kernelVersion": "6.8.0-1019-aws",
                         "osImage": "Ubuntu 24.04.1 LTS", "containerRuntimeVersion": "containerd://2.0.0",
                         "kubeletVersion": "v1.37.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": images(i),
        }
    })
}

/// The name of PV `k`.
pub fn pv_name(k: usize) -> String {
    format!("pvc-{k:08x}-0000-4000-8000-000000000000")
}

/// A PV of our driver on `node`, bound to claim `namespace/claim`, its volume `handle`.
pub fn pv(name: &str, node: &str, namespace: &str, claim: &str, handle: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name, "uid": format!("uid-{name}"), "creationTimestamp": CREATED,
            "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER,
                            "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                            "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""},
            "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer",
                           "kubernetes.io/pv-protection"],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace,
                         "name": claim, "uid": format!("uid-claim-{namespace}-{claim}"),
                         "resourceVersion": "1"},
            "csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": "",
                    "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "1795766400000-0000-stickyvol.csi.io",
                                         "stickyvol.csi.io/node": node}},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}},
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": CLASS,
            "volumeMode": "Filesystem",
        },
        "status": {"phase": "Bound", "lastPhaseTransitionTime": CREATED}
    })
}

pub fn class() -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
           "metadata": {"name": CLASS}, "provisioner": DRIVER,
           "parameters": {"onNodeLoss": "release"},
           "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"})
}

/// StatefulSet `set` with the template `data`, made before its claims.
pub fn statefulset(set: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": set, "namespace": NAMESPACE, "uid": format!("uid-{set}"),
                        "creationTimestamp": "2026-11-01T07:00:00Z"},
           "spec": {"selector": {"matchLabels": {"app": set}}, "serviceName": set, "template": {},
                    "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}})
}

/// Claim `data-<set>-0`, bound to PV `volume`.
pub fn claim(set: &str, volume: &str) -> Value {
    let name = format!("data-{set}-0");
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": name, "namespace": NAMESPACE,
                        "uid": format!("uid-claim-{NAMESPACE}-{name}"),
                        "creationTimestamp": CREATED, "labels": {"app": set}},
           "spec": {"volumeName": volume, "storageClassName": CLASS}})
}

/// Pod `<set>-0`, Pending (its node lost), waiting for its claim.
pub fn pending_pod(set: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("{set}-0"), "namespace": NAMESPACE, "uid": format!("uid-pod-{set}"),
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set,
                                             "uid": format!("uid-{set}"), "controller": true}]},
           "spec": {"containers": [],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{set}-0")}}]},
           "status": {"phase": "Pending"}})
}
