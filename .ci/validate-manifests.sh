#!/usr/bin/env bash
# Validates the Kubernetes manifests, offline:
#  1. `kubectl kustomize deploy/kubernetes` renders;
#  2. the rendered base and every file in deploy/examples validate STRICTLY (unknown fields are
#     errors, and so is a kind without a schema) against the Kubernetes $K8S_VERSION OpenAPI
#     schemas, with kubernetes-validate;
#  3. consistency checks no schema can make: names that must refer to each other do, every
#     container has resource requests and limits and a pinned image, namespaced objects are in
#     the stickyvol namespace, the registrar's kubelet path matches the socket's hostPath, and
#     the examples use the stickyvol StorageClass.
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

echo "rendering deploy/kubernetes"
kubectl kustomize deploy/kubernetes >"$work/stickyvol.yaml"

shopt -s nullglob
examples=(deploy/examples/*.yaml deploy/examples/*.yml)
if ((${#examples[@]} == 0)); then
    echo "validate-manifests: no files in deploy/examples" >&2
    exit 1
fi

status=0

# Strict schema validation. kubernetes-validate exits 0 when it finds no schema for a kind (it
# only prints WARN), so any output in --quiet mode counts as a failure.
validate() {
    local label="$1" file="$2" out rc=0
    out="$(python3 -m kubernetes_validate --strict --quiet -k "$K8S_VERSION" "$file" 2>&1)" || rc=$?
    if ((rc != 0)) || [[ -n "$out" ]]; then
        echo "FAIL $label: schema validation against Kubernetes $K8S_VERSION (strict):"
        printf '%s\n' "${out//"$file"/"$label"}" | sed 's/^/    /'
        status=1
    else
        echo "ok   $label: valid against Kubernetes $K8S_VERSION (strict)"
    fi
}

validate "kubectl kustomize deploy/kubernetes" "$work/stickyvol.yaml"
for file in "${examples[@]}"; do
    validate "$file" "$file"
done

echo "consistency checks"
python3 - "$work/stickyvol.yaml" "${examples[@]}" <<'PY' || status=1
import os
import sys

import yaml

NAMESPACE = "stickyvol"
STORAGE_CLASS = "stickyvol"
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CSIDriver", "StorageClass",
    "PriorityClass", "CustomResourceDefinition",
}
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


def arg_value(container, flag):
    for a in container.get("args", []) + container.get("command", []):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


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
    drivers = by_kind.get("CSIDriver", {})
    if len(drivers) != 1:
        problems.append(f"base: expected one CSIDriver, found {sorted(drivers)}")
    for sc in by_kind.get("StorageClass", {}).values():
        if sc["provisioner"] not in drivers:
            problems.append(f"base {ref(sc)}: provisioner {sc['provisioner']!r} is not the CSIDriver")
    if STORAGE_CLASS not in by_kind.get("StorageClass", {}):
        problems.append(f"base: no StorageClass {STORAGE_CLASS!r}")
    for o in objs:
        for spec in pod_specs(o):
            check_pod(f"base {ref(o)}", o, spec, service_accounts)
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
    return set(by_kind.get("StorageClass", {}))


def check_example(path, storage_classes):
    objs = load(path)
    if not objs:
        problems.append(f"{path}: no objects")
    claims = {o["metadata"]["name"] for o in objs if o["kind"] == "PersistentVolumeClaim"}
    for o in objs:
        pvc_specs = []
        if o["kind"] == "PersistentVolumeClaim":
            pvc_specs.append(o["spec"])
        for t in o.get("spec", {}).get("volumeClaimTemplates", []) if o["kind"] == "StatefulSet" else []:
            pvc_specs.append(t["spec"])
            claims.add(t["metadata"]["name"])
        for s in pvc_specs:
            if s.get("storageClassName") != STORAGE_CLASS:
                problems.append(f"{path} {ref(o)}: storageClassName is {s.get('storageClassName')!r}")
        for spec in pod_specs(o):
            check_pod(f"{path} {ref(o)}", o, spec, None)
            for v in spec.get("volumes", []):
                claim = v.get("persistentVolumeClaim", {}).get("claimName")
                if claim and claim not in claims:
                    problems.append(f"{path} {ref(o)}: claim {claim!r} is not defined in this file")
    if STORAGE_CLASS not in storage_classes:
        problems.append(f"{path}: StorageClass {STORAGE_CLASS!r} is not in the base")


storage_classes = check_base(sys.argv[1])
for example in sys.argv[2:]:
    check_example(example, storage_classes)
for p in problems:
    print(f"FAIL {p}")
if problems:
    sys.exit(1)
print(f"ok   base and {len(sys.argv) - 2} example file(s) are consistent")
PY

if ((status != 0)); then
    echo "validate-manifests: FAILED" >&2
fi
exit "$status"
