#!/usr/bin/env bash
# Validates the Kubernetes manifests, offline:
#  1. `kubectl kustomize` renders deploy/kubernetes (the base), deploy/kubernetes/snapshots
#     (the VolumeSnapshotClass, kept apart so the base installs without the snapshot CRDs) and
#     deploy/monitoring (PodMonitor, PrometheusRule, the dashboard's ConfigMap; apart so the base
#     installs without the Prometheus operator's CRDs);
#  2. both renderings and every file in deploy/examples validate STRICTLY (unknown fields are
#     errors, and so is a kind without a schema) against the Kubernetes $K8S_VERSION OpenAPI
#     schemas, with kubernetes-validate. The snapshot.storage.k8s.io/v1 kinds VolumeSnapshotClass
#     and VolumeSnapshot are CRDs without a built-in schema: they are checked against strict
#     schemas of our own below (CRD_SCHEMAS; metadata against the built-in ObjectMeta), and so are
#     the monitoring.coreos.com/v1 kinds PodMonitor and PrometheusRule (the fields we use). Any
#     other kind without a schema fails;
#  3. consistency checks no schema can make: names that must refer to each other do, every
#     container has resource requests and limits and a pinned image, namespaced objects are in
#     the stickyvol namespace, the registrar's kubelet path matches the socket's hostPath, the
#     sidecars use the driver's socket and distinct ports, node-deployment sidecars get NODE_NAME,
#     the examples use the stickyvol StorageClass and VolumeSnapshotClass, restores and clones
#     name sources defined in the examples (same volume mode, not smaller), and pods using a
#     restore or clone are pinned to a node with topology.stickyvol.csi.io/node; the PodMonitor
#     selects the pods of both workloads and names a port they have, the base holds no
#     monitoring.coreos.com object, and the dashboard's ConfigMap holds JSON;
#  4. each kustomize component of deploy/components, added to an overlay of the base as a user
#     adds it, renders, validates and passes the consistency checks like the base, and changes
#     only what it is for: kubelet-dir-* moves every path under /var/lib/kubelet in the DaemonSet
#     to its directory, leaving none behind (a new hostPath the component forgets fails here),
#     node-max-unavailable-* the DaemonSet's maxUnavailable, group-snapshots csi-snapshotter's gate,
#     the controller's --group-snapshots and its RBAC.
# Exit status is non-zero on any problem. Needs kubectl and python3 with pip; installs
# kubernetes-validate (pinned) into a cache directory on first use.
#
#   .ci/validate-manifests.sh
#   K8S_VERSION=1.34.0 .ci/validate-manifests.sh   # another schema version
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION="${K8S_VERSION:-1.33.0}"
KV_VERSION="1.37.0" # kubernetes-validate; ships strict schemas for Kubernetes 1.25 to 1.37
tools="${STICKYVOL_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stickyvol-ci}/kubernetes-validate-$KV_VERSION"

for tool in kubectl python3; do
    command -v "$tool" >/dev/null || { echo "validate-manifests: $tool not found" >&2; exit 2; }
done

# Installed with --target into a private directory: no virtualenv package needed, nothing added
# to the system Python (and PEP 668 "externally managed" markers do not apply).
if ! PYTHONPATH="$tools" python3 -c "import sys, kubernetes_validate.version as v; sys.exit(v.__version__ != '$KV_VERSION')" 2>/dev/null; then
    echo "installing kubernetes-validate==$KV_VERSION into $tools"
    rm -rf "$tools" "$tools.partial"
    mkdir -p "$(dirname "$tools")"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
        --no-input --target "$tools.partial" "kubernetes-validate==$KV_VERSION"
    mv "$tools.partial" "$tools"
fi
export PYTHONPATH="$tools"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "rendering deploy/kubernetes, deploy/kubernetes/snapshots and deploy/monitoring"
kubectl kustomize deploy/kubernetes >"$work/stickyvol.yaml"
kubectl kustomize deploy/kubernetes/snapshots >"$work/snapshots.yaml"
kubectl kustomize deploy/monitoring >"$work/monitoring.yaml"

# Each component in an overlay of the base, as docs/operations/install.md shows (kustomize wants
# relative paths).
components=()
for dir in deploy/components/*/; do
    name=$(basename "$dir")
    overlay="$work/overlay-$name"
    mkdir -p "$overlay"
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n' \
        "$(realpath --relative-to="$overlay" deploy/kubernetes)" "$(realpath --relative-to="$overlay" "$dir")" \
        >"$overlay/kustomization.yaml"
    echo "rendering deploy/kubernetes with the component $dir"
    kubectl kustomize "$overlay" >"$work/component-$name.yaml"
    components+=("$name")
done

shopt -s nullglob
examples=(deploy/examples/*.yaml deploy/examples/*.yml)
if ((${#examples[@]} == 0)); then
    echo "validate-manifests: no files in deploy/examples" >&2
    exit 1
fi

status=0

# schema_check VERSION (LABEL FILE)...: strict schema validation against VERSION's schemas.
schema_check() {
    python3 - "$@" <<'PY'
import sys

import jsonschema
import yaml
import kubernetes_validate
from kubernetes_validate.utils import all_versions, major_minor, schema_contents
from referencing import Registry, Resource

version = sys.argv[1]
pairs = list(zip(sys.argv[2::2], sys.argv[3::2]))

# The built-in schemas kubernetes-validate would use for this version (the newest not newer).
schema_version = [v for v in all_versions() if major_minor(v) <= major_minor(version)][-1]
definitions = schema_contents(
    f"kubernetes-json-schema/v{schema_version}-local-strict/_definitions.json", version)
OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
registry = Resource.from_contents(definitions) @ Registry()


def strict(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


NON_EMPTY = {"type": "string", "minLength": 1}
METADATA = {"allOf": [{"$ref": OBJECT_META}, {"required": ["name"]}]}

# Written from the snapshot.storage.k8s.io/v1 API (external-snapshotter's CRDs), as strict as
# kubernetes-validate's built-in schemas: unknown fields are errors. VolumeSnapshot also requires
# volumeSnapshotClassName: our manifests name their class rather than rely on a default.
CRD_SCHEMAS = {
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass"): strict({
        "apiVersion": {"const": "snapshot.storage.k8s.io/v1"},
        "kind": {"const": "VolumeSnapshotClass"},
        "metadata": METADATA,
        "driver": NON_EMPTY,
        "deletionPolicy": {"enum": ["Delete", "Retain"]},
        "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
    }, required=["apiVersion", "kind", "metadata", "driver", "deletionPolicy"]),
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshot"): strict({
        "apiVersion": {"const": "snapshot.storage.k8s.io/v1"},
        "kind": {"const": "VolumeSnapshot"},
        "metadata": METADATA,
        "spec": strict({
            # Exactly one of the two (oneOf fails when both or neither are present).
            "source": dict(strict({
                "persistentVolumeClaimName": NON_EMPTY,
                "volumeSnapshotContentName": NON_EMPTY,
            }), oneOf=[{"required": ["persistentVolumeClaimName"]},
                       {"required": ["volumeSnapshotContentName"]}]),
            "volumeSnapshotClassName": NON_EMPTY,
        }, required=["source", "volumeSnapshotClassName"]),
    }, required=["apiVersion", "kind", "metadata", "spec"]),
}

# The monitoring.coreos.com/v1 kinds of deploy/monitoring, written from the Prometheus operator's
# API reference: the fields we use (and a few close to them), strictly, so a misspelt or
# misplaced field fails here rather than being dropped by the API server.
LABEL_SELECTOR = {"$ref": "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
DURATION = {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"}
RELABELING = strict({
    "sourceLabels": {"type": "array", "items": NON_EMPTY},
    "separator": {"type": "string"},
    "targetLabel": NON_EMPTY,
    "regex": {"type": "string"},
    "modulus": {"type": "integer"},
    "replacement": {"type": "string"},
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                        "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep"]},
})
CRD_SCHEMAS.update({
    ("monitoring.coreos.com/v1", "PodMonitor"): strict({
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": METADATA,
        "spec": strict({
            "jobLabel": {"type": "string"},
            "podTargetLabels": {"type": "array", "items": NON_EMPTY},
            "selector": LABEL_SELECTOR,
            "namespaceSelector": strict({"any": {"type": "boolean"},
                                         "matchNames": {"type": "array", "items": NON_EMPTY}}),
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": strict({
                "port": NON_EMPTY,
                "path": {"type": "string", "pattern": "^/"},
                "scheme": {"enum": ["http", "https"]},
                "interval": DURATION,
                "scrapeTimeout": DURATION,
                "honorLabels": {"type": "boolean"},
                "relabelings": {"type": "array", "items": RELABELING},
                "metricRelabelings": {"type": "array", "items": RELABELING},
            })},
        }, required=["selector", "podMetricsEndpoints"]),
    }, required=["apiVersion", "kind", "metadata", "spec"]),
    ("monitoring.coreos.com/v1", "PrometheusRule"): strict({
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": strict({
            "groups": {"type": "array", "minItems": 1, "items": strict({
                "name": NON_EMPTY,
                "interval": DURATION,
                "rules": {"type": "array", "minItems": 1, "items": dict(strict({
                    "alert": NON_EMPTY,
                    "record": NON_EMPTY,
                    "expr": NON_EMPTY,
                    "for": DURATION,
                    "keep_firing_for": DURATION,
                    "labels": STRING_MAP,
                    "annotations": STRING_MAP,
                }, required=["expr"]), oneOf=[{"required": ["alert"]}, {"required": ["record"]}])},
            }, required=["name", "rules"])},
        }, required=["groups"]),
    }, required=["apiVersion", "kind", "metadata", "spec"]),
})


def errors_of(doc):
    if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
        return ["a document without apiVersion and kind"]
    name = f"{doc['kind']}/{(doc.get('metadata') or {}).get('name', '?')}"
    schema = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        validator = jsonschema.Draft202012Validator(schema, registry=registry)
        return [f"{name}: {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path)))]
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{name}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{name}: no schema for kind {doc['kind']} ({doc['apiVersion']}) in Kubernetes "
                f"{version}, and none of ours (CRD_SCHEMAS in .ci/validate-manifests.sh)"]
    except Exception as e:  # an unusable schema or version
        return [f"{name}: could not be validated: {e}"]
    return []


failed = False
for label, path in pairs:
    try:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
    except Exception as e:  # a YAML error
        docs, problems = [], [f"cannot parse: {e}"]
    else:
        problems = [p for d in docs for p in errors_of(d)]
        if not docs:
            problems.append("no objects")
    if problems:
        failed = True
        print(f"FAIL {label}: schema validation against Kubernetes {version} (strict):")
        for p in problems:
            print(f"    {p}")
    else:
        print(f"ok   {label}: valid against Kubernetes {version} (strict)")
sys.exit(1 if failed else 0)
PY
}

# Strict schema validation, one line per file. Arguments: the Kubernetes version, then pairs of
# label and file.
targets=(
    "kubectl kustomize deploy/kubernetes" "$work/stickyvol.yaml"
    "kubectl kustomize deploy/kubernetes/snapshots" "$work/snapshots.yaml"
    "kubectl kustomize deploy/monitoring" "$work/monitoring.yaml"
)
# An example of a kind newer than $K8S_VERSION says which version's schemas it needs, in a line
# `# kubernetes-schema: X.Y.Z` (VolumeAttributesClass, storage.k8s.io/v1 from 1.34).
newer=()
for file in "${examples[@]}"; do
    needs=$(sed -n 's/^# kubernetes-schema: \([0-9.]*\)$/\1/p' "$file")
    if [[ -n $needs ]]; then
        newer+=("$needs" "$file")
    else
        targets+=("$file" "$file")
    fi
done
for name in "${components[@]}"; do
    targets+=("deploy/kubernetes with deploy/components/$name" "$work/component-$name.yaml")
done
schema_check "$K8S_VERSION" "${targets[@]}" || status=1
for ((i = 0; i < ${#newer[@]}; i += 2)); do
    schema_check "${newer[i]}" "${newer[i + 1]}" "${newer[i + 1]}" || status=1
done

# The base, and the base with each component, with the snapshot class and the examples.
for base in stickyvol "${components[@]/#/component-}"; do
echo "consistency checks ($base.yaml)"
python3 - "$work/$base.yaml" "$work/snapshots.yaml" "${examples[@]}" <<'PY' || status=1
import os
import re
import sys

import yaml

NAMESPACE = "stickyvol"
STORAGE_CLASS = "stickyvol"
SNAPSHOT_CLASS = "stickyvol"
TOPOLOGY_KEY = "topology.stickyvol.csi.io/node"
RESTORE_PLACEMENT = False  # set by check_base: the controller runs --restore-placement=on
SNAPSHOT_GROUP = "snapshot.storage.k8s.io"
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CSIDriver", "StorageClass",
    "PriorityClass", "CustomResourceDefinition", "VolumeSnapshotClass",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}
# Flags by which a sidecar (or stickyvol) listens on a TCP port in the pod's network namespace.
LISTEN_FLAGS = ("--http-endpoint", "--metrics-address", "--health-port")
problems = []


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "metadata" not in d:
            problems.append(f"{path}: a document is not a Kubernetes object")
    return [d for d in docs if isinstance(d, dict) and "kind" in d and "metadata" in d]


def ref(obj):
    return f"{obj['kind']}/{obj['metadata'].get('name', '?')}"


def pod_specs(obj):
    kind = obj["kind"]
    if kind == "Pod":
        yield obj["spec"]
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield obj["spec"]["template"]["spec"]
    elif kind == "CronJob":
        yield obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def arg_value(container, flag):
    for a in container.get("args", []) + container.get("command", []):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def driver_endpoint(container):
    """The socket a stickyvol container serves: its --endpoint flag, else its CSI_ENDPOINT env."""
    flag = arg_value(container, "--endpoint")
    if flag is not None:
        return flag
    for var in container.get("env", []):
        if var.get("name") == "CSI_ENDPOINT":
            return var.get("value")
    return None


def has_arg(container, flag):
    args = container.get("args", []) + container.get("command", [])
    return flag in args or f"{flag}=true" in args


def check_pod(where, obj, spec, service_accounts):
    containers = spec.get("initContainers", []) + spec.get("containers", [])
    names = [c["name"] for c in containers]
    if len(names) != len(set(names)):
        problems.append(f"{where}: container names are not unique: {names}")
    volumes = {v["name"] for v in spec.get("volumes", [])}
    if obj["kind"] == "StatefulSet":
        volumes |= {t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", [])}
    ports = {p["name"] for c in containers for p in c.get("ports", []) if "name" in p}
    for c in containers:
        at = f"{where} container {c['name']}"
        image = c.get("image", "")
        last = image.rsplit("/", 1)[-1]
        if "@" not in image and (":" not in last or last.endswith(":latest")):
            problems.append(f"{at}: image {image!r} is not pinned to a tag or digest")
        resources = c.get("resources", {})
        for section in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(section, {}):
                    problems.append(f"{at}: no {section}.{resource}")
        for m in c.get("volumeMounts", []) + c.get("volumeDevices", []):
            if m["name"] not in volumes:
                problems.append(f"{at}: mounts undeclared volume {m['name']!r}")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            for handler in ("httpGet", "tcpSocket", "grpc"):
                port = c.get(probe, {}).get(handler, {}).get("port")
                if isinstance(port, str) and port not in ports:
                    problems.append(f"{at}: {probe} uses unknown port name {port!r}")
    sa = spec.get("serviceAccountName")
    if service_accounts is not None and sa and sa not in service_accounts:
        problems.append(f"{where}: serviceAccountName {sa!r} is not deployed")


def check_sidecars(where, spec):
    """The sidecars talk to the driver's socket, listen on distinct declared ports, and the
    node-deployment ones know their node and run without leader election."""
    containers = spec["containers"]
    endpoints = {driver_endpoint(c) for c in containers} - {None}
    sockets = {e.removeprefix("unix://") for e in endpoints}
    declared = {p["containerPort"] for c in containers for p in c.get("ports", [])}
    listening = {}
    for c in containers:
        at = f"{where} container {c['name']}"
        address = arg_value(c, "--csi-address")
        if address is not None and address not in sockets:
            problems.append(f"{at}: --csi-address={address} is not the driver's --endpoint {sorted(endpoints)}")
        for flag in LISTEN_FLAGS:
            value = arg_value(c, flag)
            if value is None:
                continue
            port = int(value.rsplit(":", 1)[-1])
            if port in listening:
                problems.append(f"{at}: {flag} port {port} is also used by container {listening[port]}")
            listening[port] = c["name"]
            if port not in declared:
                problems.append(f"{at}: {flag} port {port} is not declared as a containerPort")
        if has_arg(c, "--node-deployment"):
            if has_arg(c, "--leader-election"):
                problems.append(f"{at}: --node-deployment with leader election (refused by the sidecars)")
            env = {e["name"]: e for e in c.get("env", [])}
            field = env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if field != "spec.nodeName":
                problems.append(f"{at}: --node-deployment without env NODE_NAME from spec.nodeName")


def check_base(path):
    objs = load(path)
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    for o in objs:
        namespace = o["metadata"].get("namespace")
        if o["kind"] in CLUSTER_SCOPED:
            if namespace:
                problems.append(f"base {ref(o)}: cluster-scoped but has namespace {namespace!r}")
        elif namespace != NAMESPACE:
            problems.append(f"base {ref(o)}: namespace is {namespace!r}, want {NAMESPACE!r}")
    service_accounts = set(by_kind.get("ServiceAccount", {}))
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for b in by_kind.get(kind, {}).values():
            role = b["roleRef"]
            if role["name"] not in by_kind.get(role["kind"], {}):
                problems.append(f"base {ref(b)}: roleRef {role['kind']}/{role['name']} is not deployed")
            for s in b.get("subjects", []):
                if s["kind"] == "ServiceAccount" and (
                    s["name"] not in service_accounts or s.get("namespace") != NAMESPACE
                ):
                    problems.append(f"base {ref(b)}: subject {s.get('namespace')}/{s['name']} is not deployed")
    global RESTORE_PLACEMENT
    RESTORE_PLACEMENT = any(
        "--restore-placement=on" in c.get("args", [])
        for o in by_kind.get("StatefulSet", {}).values()
        for c in o["spec"]["template"]["spec"]["containers"])
    drivers = by_kind.get("CSIDriver", {})
    if len(drivers) != 1:
        problems.append(f"base: expected one CSIDriver, found {sorted(drivers)}")
    for sc in by_kind.get("StorageClass", {}).values():
        if sc["provisioner"] not in drivers:
            problems.append(f"base {ref(sc)}: provisioner {sc['provisioner']!r} is not the CSIDriver")
    if STORAGE_CLASS not in by_kind.get("StorageClass", {}):
        problems.append(f"base: no StorageClass {STORAGE_CLASS!r}")
    for kind in by_kind.keys() & {"VolumeSnapshotClass", "VolumeSnapshot", "VolumeSnapshotContent"}:
        problems.append(f"base: has a {kind}; it would not install without the snapshot CRDs "
                        "(put it in deploy/kubernetes/snapshots)")
    for o in objs:
        for spec in pod_specs(o):
            check_pod(f"base {ref(o)}", o, spec, service_accounts)
            check_sidecars(f"base {ref(o)}", spec)
            # kubelet must find the socket where the registrar says it is.
            for c in spec["containers"]:
                host_socket = arg_value(c, "--kubelet-registration-path")
                if host_socket is None:
                    continue
                socket = arg_value(c, "--csi-address") or ""
                mount = next((m for m in c.get("volumeMounts", [])
                              if m["mountPath"].rstrip("/") == os.path.dirname(socket)), None)
                volume = mount and next((v for v in spec["volumes"] if v["name"] == mount["name"]), None)
                host_dir = ((volume or {}).get("hostPath") or {}).get("path", "").rstrip("/")
                if host_dir != os.path.dirname(host_socket) or os.path.basename(socket) != os.path.basename(host_socket):
                    problems.append(
                        f"base {ref(o)} container {c['name']}: --kubelet-registration-path={host_socket} "
                        f"is not the hostPath behind --csi-address={socket}")
    return set(by_kind.get("StorageClass", {})), set(drivers)


def check_snapshot_classes(path, drivers):
    """deploy/kubernetes/snapshots holds VolumeSnapshotClasses of our driver and nothing else."""
    objs = load(path)
    classes = {}
    for o in objs:
        if o["kind"] != "VolumeSnapshotClass":
            problems.append(f"snapshots {ref(o)}: only VolumeSnapshotClasses belong here (the rest is in the base)")
            continue
        classes[o["metadata"]["name"]] = o
        if o["metadata"].get("namespace"):
            problems.append(f"snapshots {ref(o)}: cluster-scoped but has namespace")
        if o.get("driver") not in drivers:
            problems.append(f"snapshots {ref(o)}: driver {o.get('driver')!r} is not the CSIDriver {sorted(drivers)}")
    defaults = [n for n, o in classes.items()
                if (o["metadata"].get("annotations") or {}).get(
                    "snapshot.storage.kubernetes.io/is-default-class") == "true"]
    if len(defaults) > 1:
        problems.append(f"snapshots: more than one default VolumeSnapshotClass for the driver: {defaults}")
    if SNAPSHOT_CLASS not in classes:
        problems.append(f"snapshots: no VolumeSnapshotClass {SNAPSHOT_CLASS!r}")
    return set(classes)


QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def storage_bytes(claim_spec):
    value = str(claim_spec.get("resources", {}).get("requests", {}).get("storage", ""))
    m = QUANTITY.match(value)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def volume_mode(claim_spec):
    return claim_spec.get("volumeMode", "Filesystem")


def pinned(spec):
    """Does the pod only run on nodes chosen by the stickyvol topology label?"""
    if TOPOLOGY_KEY in spec.get("nodeSelector", {}):
        return True
    terms = (spec.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
    return bool(terms) and all(
        any(e.get("key") == TOPOLOGY_KEY and e.get("operator") == "In"
            for e in t.get("matchExpressions", []))
        for t in terms)


def check_examples(paths, storage_classes, snapshot_classes):
    files = {path: load(path) for path in paths}
    # Restores and clones may name sources from other example files (pvc-pod.yaml's claim).
    all_claims, all_snapshots = {}, {}
    for objs in files.values():
        for o in objs:
            if o["kind"] == "PersistentVolumeClaim":
                all_claims[o["metadata"]["name"]] = o["spec"]
            elif o["kind"] == "VolumeSnapshot":
                all_snapshots[o["metadata"]["name"]] = o["spec"]
    for path, objs in files.items():
        if not objs:
            problems.append(f"{path}: no objects")
        claims = {o["metadata"]["name"] for o in objs if o["kind"] == "PersistentVolumeClaim"}
        restored = set()  # claims with a dataSource: their pods must be pinned
        for o in objs:
            pvc_specs = []
            if o["kind"] == "PersistentVolumeClaim":
                pvc_specs.append((o["metadata"]["name"], o["spec"]))
            for t in o.get("spec", {}).get("volumeClaimTemplates", []) if o["kind"] == "StatefulSet" else []:
                pvc_specs.append((t["metadata"]["name"], t["spec"]))
                claims.add(t["metadata"]["name"])
            for name, s in pvc_specs:
                if s.get("storageClassName") != STORAGE_CLASS:
                    problems.append(f"{path} {ref(o)}: storageClassName is {s.get('storageClassName')!r}")
                if "dataSourceRef" in s:
                    problems.append(f"{path} {ref(o)}: use dataSource (the examples keep to one form)")
                source = s.get("dataSource")
                if source is None:
                    continue
                restored.add(name)
                kind, group, source_name = source.get("kind"), source.get("apiGroup", ""), source.get("name")
                if kind == "VolumeSnapshot" and group == SNAPSHOT_GROUP:
                    snapshot = all_snapshots.get(source_name)
                    if snapshot is None:
                        problems.append(f"{path} {ref(o)}: dataSource VolumeSnapshot {source_name!r} is not in deploy/examples")
                        continue
                    origin = all_claims.get(snapshot["source"].get("persistentVolumeClaimName"))
                elif kind == "PersistentVolumeClaim" and not group:
                    origin = all_claims.get(source_name)
                    if origin is None:
                        problems.append(f"{path} {ref(o)}: dataSource claim {source_name!r} is not in deploy/examples")
                        continue
                else:
                    problems.append(f"{path} {ref(o)}: dataSource {group}/{kind} is neither a VolumeSnapshot nor a claim")
                    continue
                if origin is None:
                    continue
                if volume_mode(origin) != volume_mode(s):
                    problems.append(f"{path} {ref(o)}: volumeMode {volume_mode(s)} differs from its source's {volume_mode(origin)}")
                if None not in (storage_bytes(origin), storage_bytes(s)) and storage_bytes(s) < storage_bytes(origin):
                    problems.append(f"{path} {ref(o)}: requests less storage than its source")
        for o in objs:
            if o["kind"] == "VolumeSnapshot":
                spec = o["spec"]
                if spec.get("volumeSnapshotClassName") not in snapshot_classes:
                    problems.append(f"{path} {ref(o)}: volumeSnapshotClassName {spec.get('volumeSnapshotClassName')!r} "
                                    f"is not in deploy/kubernetes/snapshots {sorted(snapshot_classes)}")
                source = spec.get("source", {}).get("persistentVolumeClaimName")
                if source is not None and source not in all_claims:
                    problems.append(f"{path} {ref(o)}: source claim {source!r} is not in deploy/examples")
            for spec in pod_specs(o):
                check_pod(f"{path} {ref(o)}", o, spec, None)
                for v in spec.get("volumes", []):
                    claim = v.get("persistentVolumeClaim", {}).get("claimName")
                    if claim and claim not in claims:
                        problems.append(f"{path} {ref(o)}: claim {claim!r} is not defined in this file")
                    # Restore placement sends such claims to their source's node; without it
                    # the pod must be pinned there.
                    if claim in restored and not RESTORE_PLACEMENT and not pinned(spec):
                        problems.append(f"{path} {ref(o)}: uses restored/cloned claim {claim!r} but is not pinned "
                                        f"with a nodeSelector (or required node affinity) on {TOPOLOGY_KEY}, "
                                        f"and the controller runs without --restore-placement=on")
    if STORAGE_CLASS not in storage_classes:
        problems.append(f"examples: StorageClass {STORAGE_CLASS!r} is not in the base")


storage_classes, drivers = check_base(sys.argv[1])
snapshot_classes = check_snapshot_classes(sys.argv[2], drivers)
check_examples(sys.argv[3:], storage_classes, snapshot_classes)
for p in problems:
    print(f"FAIL {p}")
if problems:
    sys.exit(1)
print(f"ok   base, snapshot class and {len(sys.argv) - 3} example file(s) are consistent")
PY
done

echo "the components change only what they are for"
python3 - "$work/stickyvol.yaml" "${components[@]}" <<'PY' || status=1
import copy
import re
import sys

import yaml

DEFAULT = "/var/lib/kubelet"
# The default kubelet directory as a path of its own (not inside another, as microk8s' is).
UNDER_DEFAULT = re.compile(r"(?<![\w.-])" + re.escape(DEFAULT) + r"(?![\w.-])")
NODE = ("DaemonSet", "stickyvol-node")


def load(path):
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(open(path)) if d}


def left_behind(objects):
    """The lines of the rendering that still name a path under the default kubelet directory."""
    text = yaml.safe_dump_all(objects.values())
    return [line.strip() for line in text.splitlines() if UNDER_DEFAULT.search(line)]


def serve_flag(ds, flag):
    containers = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
    return next(a.split("=", 1)[1] for a in containers["stickyvol"]["args"] if a.startswith(flag + "="))


def expected_kubelet_dir(base, rendered):
    """The base with the DaemonSet's kubelet directory moved where the rendering's --kubelet-dir says."""
    to = serve_flag(rendered[NODE], "--kubelet-dir")
    want = copy.deepcopy(base)
    want[NODE] = yaml.safe_load(UNDER_DEFAULT.sub(to, yaml.safe_dump(base[NODE])))
    return want, left_behind(rendered)


def expected_max_unavailable(base, rendered):
    value = rendered[NODE]["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"]
    want = copy.deepcopy(base)
    want[NODE]["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = value
    same = value == base[NODE]["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"]
    return want, ["maxUnavailable unchanged"] if same else []


GROUP_ADDS = [("ClusterRole", "stickyvol-group-snapshots"),
              ("ClusterRoleBinding", "stickyvol-group-snapshots")]


def expected_group_snapshots(base, rendered):
    """The base with csi-snapshotter's group snapshot gate, the controller's --group-snapshots=on,
    and the routing's RBAC added."""
    want = copy.deepcopy(base)
    for kind_name, container, arg in [(NODE, "csi-snapshotter", "--feature-gates=CSIVolumeGroupSnapshot=true"),
                                      (("StatefulSet", "stickyvol-controller"), "stickyvol", "--group-snapshots=on")]:
        spec = want[kind_name]["spec"]["template"]["spec"]
        next(c for c in spec["containers"] if c["name"] == container)["args"].append(arg)
    added = sorted(k for k in rendered if k not in base)
    want.update({k: rendered[k] for k in added if k in GROUP_ADDS})
    return want, [] if added == sorted(GROUP_ADDS) else [f"adds {added}, not {sorted(GROUP_ADDS)}"]


CHECKS = {"kubelet-dir-": expected_kubelet_dir, "node-max-unavailable-": expected_max_unavailable,
          "group-snapshots": expected_group_snapshots}

base = load(sys.argv[1])
problems = []
# The check itself: a hostPath under the default directory added to the base is found.
planted = copy.deepcopy(base)
planted[NODE]["spec"]["template"]["spec"]["volumes"].append({"name": "new", "hostPath": {"path": DEFAULT + "/pods"}})
if not left_behind({NODE: planted[NODE]}) or left_behind({NODE: yaml.safe_load(
        yaml.safe_dump(planted[NODE]).replace(DEFAULT, "/var/snap/microk8s/common" + DEFAULT))}):
    problems.append("left_behind does not tell a path under /var/lib/kubelet from one elsewhere")
for name in sys.argv[2:]:
    check = next((f for prefix, f in CHECKS.items() if name.startswith(prefix)), None)
    if check is None:
        problems.append(f"deploy/components/{name}: no check for it here (CHECKS)")
        continue
    rendered = load(sys.argv[1].replace("stickyvol.yaml", f"component-{name}.yaml"))
    want, wrong = check(base, rendered)
    problems += [f"deploy/components/{name}: {w}" for w in wrong]
    for key in sorted(want.keys() | rendered.keys()):
        if want.get(key) != rendered.get(key):
            problems.append(f"deploy/components/{name}: {key[0]} {key[1]} is not the base's with the component's change alone")
    if not wrong and all(want.get(k) == rendered.get(k) for k in want.keys() | rendered.keys()):
        print(f"ok   deploy/components/{name}: changes only what it is for")
for p in problems:
    print(f"FAIL {p}")
sys.exit(1 if problems else 0)
PY

# deploy/monitoring against the base: the PodMonitor scrapes what the base runs.
python3 - "$work/stickyvol.yaml" "$work/monitoring.yaml" <<'PY' || status=1
import json
import sys

import yaml

base = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
monitoring = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
problems = []
for o in base:
    if o["apiVersion"].startswith("monitoring.coreos.com/"):
        problems.append(f"base: {o['kind']} {o['metadata']['name']}: the operator's kinds belong in "
                        "deploy/monitoring (the base must apply without their CRDs)")
workloads = [o for o in base if o["kind"] in ("DaemonSet", "StatefulSet")]
monitors = [o for o in monitoring if o["kind"] == "PodMonitor"]
if not monitors:
    problems.append("monitoring: no PodMonitor")
for m in monitors:
    ns = m["metadata"].get("namespace")
    wanted = m["spec"]["selector"].get("matchLabels", {})
    ports = {e["port"] for e in m["spec"]["podMetricsEndpoints"]}
    # The driver's port on every pod; each sidecar's where that sidecar runs (a pod without an
    # endpoint's port is not scraped there), so every endpoint's port on some pod.
    found = set()
    for w in workloads:
        template = w["spec"]["template"]
        name = f"{w['kind']} {w['metadata']['name']}"
        labels = template["metadata"].get("labels", {})
        if w["metadata"].get("namespace") != ns or any(labels.get(k) != v for k, v in wanted.items()):
            problems.append(f"PodMonitor {m['metadata']['name']}: does not select the pods of {name}")
            continue
        named = {p.get("name") for c in template["spec"]["containers"] for p in c.get("ports", [])}
        found |= named
        if "metrics" not in named:
            problems.append(f"PodMonitor {m['metadata']['name']}: {name}'s pods have no port 'metrics'")
    if "metrics" not in ports:
        problems.append(f"PodMonitor {m['metadata']['name']}: no endpoint for the driver's port 'metrics'")
    for port in sorted(ports - found):
        problems.append(f"PodMonitor {m['metadata']['name']}: no pod has the port {port!r}")
        job = labels.get(m["spec"].get("jobLabel", ""))
        if job != "stickyvol":
            problems.append(f"PodMonitor {m['metadata']['name']}: {name}'s job would be {job!r}, "
                            "not stickyvol (the alerts select up{job=\"stickyvol\"})")
dashboards = [o for o in monitoring if o["kind"] == "ConfigMap"]
if not dashboards:
    problems.append("monitoring: no dashboard ConfigMap")
for c in dashboards:
    if c["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        problems.append(f"ConfigMap {c['metadata']['name']}: no label grafana_dashboard: \"1\" (Grafana's sidecar)")
    for key, text in c.get("data", {}).items():
        try:
            json.loads(text)
        except ValueError as e:
            problems.append(f"ConfigMap {c['metadata']['name']}: {key} is not JSON: {e}")
for o in monitoring:
    if o["metadata"].get("namespace") != "stickyvol":
        problems.append(f"monitoring: {o['kind']} {o['metadata']['name']} is not in the namespace stickyvol")
for p in problems:
    print(f"FAIL {p}")
if problems:
    sys.exit(1)
print(f"ok   deploy/monitoring: the PodMonitor scrapes the metrics port of {len(workloads)} workload(s)")
PY

if ((status != 0)); then
    echo "validate-manifests: FAILED" >&2
fi
exit "$status"
