#!/usr/bin/env python3
"""Checks the RBAC and admission objects of a `helm template` rendering: what the controller's
ServiceAccount may do is exactly what nodeLoss.mode, restorePlacement, checkClasses, the
overflow check and moves need, the node plugin's ConfigMap rights are held to its own report by the
ValidatingAdmissionPolicy, and the node plugin can neither evict nor read a Node.

    check_rbac.py RENDERED.yaml MODE DRIVER [PLACEMENT [CLASSES [OVERFLOW [MOVES]]]]

MODE is off, dry-run or on; DRIVER the driverName rendered; PLACEMENT (restorePlacement),
CLASSES (checkClasses), OVERFLOW (overflowCheckInterval > 0) and MOVES (moves) on (default) or
off.
"""
import sys

import yaml

rendered, mode, driver = sys.argv[1:4]
placement = sys.argv[4] if len(sys.argv) > 4 else "on"
class_check = sys.argv[5] if len(sys.argv) > 5 else "on"
overflow = sys.argv[6] if len(sys.argv) > 6 else "on"
moves = sys.argv[7] if len(sys.argv) > 7 else "on"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


with open(rendered) as f:
    objs = [d for d in yaml.safe_load_all(f) if d]
roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
         for o in objs if o["kind"] in ("Role", "ClusterRole")}


def grants(account):
    """Every (namespace or '*', apiGroup, resource, verb, resourceName or '*') the account gets."""
    out = set()
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        scope = b["metadata"].get("namespace", "*")
        role = roles.get((ref["kind"], b["metadata"].get("namespace") if ref["kind"] == "Role" else None,
                          ref["name"]))
        check(role is not None, f"{b['kind']} {b['metadata']['name']}: its role is rendered")
        for rule in (role or {}).get("rules", []):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames", ["*"]):
                            out.add((scope, group, resource, verb, name))
    return out


def rules(scope, group, resources, verbs, name="*"):
    return {(scope, group, r, v, name) for r in resources for v in verbs}


ns = "stickyvol"
resizer = (rules("*", "", ["persistentvolumes"], ["get", "list", "watch", "patch"])
           | rules("*", "", ["persistentvolumeclaims"], ["get", "list", "watch"])
           | rules("*", "", ["persistentvolumeclaims/status"], ["patch"])
           | rules("*", "", ["events"], ["create", "update", "patch"])
           # its modify controller: a claim's VolumeAttributesClass (IO limits)
           | rules("*", "storage.k8s.io", ["volumeattributesclasses"], ["get", "list", "watch"]))
reads = (rules("*", "", ["nodes"], ["get", "list", "watch"])
         | rules("*", "", ["persistentvolumes"], ["get", "list", "watch"])
         | rules("*", "", ["persistentvolumeclaims", "pods"], ["list"])
         | rules("*", "apps", ["statefulsets"], ["list"])
         | rules("*", "storage.k8s.io", ["storageclasses"], ["list", "watch"])
         | rules("*", "storage.k8s.io", ["volumeattributesclasses"], ["get"])
         | rules("*", "events.k8s.io", ["events"], ["create"])
         | rules(ns, "coordination.k8s.io", ["leases"], ["create"])
         | rules(ns, "coordination.k8s.io", ["leases"], ["get", "update"], "stickyvol-node-loss")
         | rules(ns, "", ["configmaps"], ["list"]))
writes = (rules("*", "", ["persistentvolumes"], ["delete", "patch"])
          | rules("*", "", ["persistentvolumeclaims", "pods"], ["delete"])
          | rules(ns, "", ["configmaps"], ["create", "patch"]))
placing = (rules("*", "", ["persistentvolumeclaims"], ["get", "list", "watch", "patch"])
           | rules("*", "", ["persistentvolumes", "nodes"], ["get"])
           | rules("*", "", ["nodes", "pods"], ["list"])
           | rules("*", "storage.k8s.io", ["storageclasses"], ["get"])
           | rules("*", "snapshot.storage.k8s.io", ["volumesnapshots", "volumesnapshotcontents"], ["get"])
           | rules("*", "events.k8s.io", ["events"], ["create"]))
wanted = {"off": resizer, "dry-run": resizer | reads, "on": resizer | reads | writes}[mode]
checking = (rules("*", "storage.k8s.io", ["storageclasses"], ["list", "watch"])
            | rules("*", "events.k8s.io", ["events"], ["create"]))
if placement == "on":
    wanted = wanted | placing
evicting = (rules("*", "", ["persistentvolumes"], ["list", "watch"])
            | rules("*", "", ["pods"], ["get"])
            | rules("*", "", ["pods/eviction"], ["create"])
            | rules("*", "events.k8s.io", ["events"], ["create"]))
if class_check == "on":
    wanted = wanted | checking
if overflow == "on":
    wanted = wanted | evicting
moving = (rules("*", "", ["persistentvolumeclaims"], ["get", "list", "create", "delete", "patch"])
          | rules("*", "", ["persistentvolumes"], ["get", "list", "patch"])
          | rules("*", "", ["pods"], ["get", "list"])
          | rules("*", "", ["nodes"], ["get"])
          | rules("*", "apps", ["statefulsets"], ["get"])
          | rules("*", "events.k8s.io", ["events"], ["create"])
          | rules(ns, "", ["configmaps"], ["get"])
          | rules(ns, "storage.k8s.io", ["csistoragecapacities"], ["list"]))
if moves == "on":
    wanted = wanted | moving
got = grants("stickyvol-controller")
check(got == wanted, f"nodeLoss.mode {mode}, restorePlacement {placement}, checkClasses {class_check}, overflow check {overflow}, moves {moves}: the controller may do exactly what they need"
      + ("" if got == wanted else f" (extra: {sorted(got - wanted)}, missing: {sorted(wanted - got)})"))
deletes = {g for g in got if g[3] == "delete"}
# Node loss deletes PVs, claims and pods; a move only claims (its own temporary one, and the
# claim it makes again).
wanted_deletes = (rules("*", "", ["persistentvolumeclaims"], ["delete"]) if moves == "on" else set()) \
    | ({g for g in writes if g[3] == "delete"} if mode == "on" else set())
check(deletes == wanted_deletes,
      f"nodeLoss.mode {mode}, moves {moves}: deletes only what they need: {sorted(deletes)}")

# The node plugin: ConfigMaps only in its namespace, and the policy holding it to its report.
node = grants("stickyvol-node")
config_maps = {g for g in node if g[2] == "configmaps"}
check(config_maps == rules(ns, "", ["configmaps"], ["create", "patch", "delete", "get", "list", "watch"]),
      f"the node plugin writes ConfigMaps (its report, its transfer advert), deletes its release notice and reads them only in {ns}, no update: {sorted(config_maps)}")
transfer = {g for g in node if g[1] == "authentication.k8s.io"}
check(transfer == rules("*", "authentication.k8s.io", ["tokenreviews"], ["create"]),
      f"the node plugin reviews tokens (transfers), nothing more of authentication: {sorted(transfer)}")
policy = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
          and o["metadata"]["name"] == "stickyvol-orphan-report"]
binding = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"
           and o["spec"]["policyName"] == "stickyvol-orphan-report"]
check(len(policy) == 1 and len(binding) == 1, "the report policy and its binding are rendered")
if policy and binding:
    spec = policy[0]["spec"]
    check(spec["failurePolicy"] == "Fail", "the policy fails closed")
    check(binding[0]["spec"]["validationActions"] == ["Deny"], "the binding denies")
    check(set(spec["matchConstraints"]["resourceRules"][0]["operations"]) == {"CREATE", "UPDATE", "DELETE"},
          "the policy sees every verb the Role grants")
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    check(variables["report"] == f"'{driver}-orphans-' + variables.node", f"the report's name is {driver}-orphans-<node>")
    check(variables["notice"] == f"'{driver}-released-' + variables.node", f"the release notice's name is {driver}-released-<node>")
    check(any("request.operation == 'DELETE' && request.name == variables.notice" in v["expression"]
              for v in spec["validations"]), "a node only deletes its release notice")
    check(any(f"== '{driver}'" in v["expression"] for v in spec["validations"]),
          f"the report's label value is {driver}")

# A node plugin reads no Node: RBAC cannot hold a shared ServiceAccount to each pod's own, so
# the orphan check learns of its node's loss from the controller's release notice.
node_nodes = {g for g in node if g[2] == "nodes"}
check(not node_nodes, f"the node plugin reads no Node: {sorted(node_nodes)}")

# Evictions: the node plugin has no eviction right (it asks on its PV); the controller's
# evictions are held by its fence to pods named by uid with their own grace period.
pod_grants = {g for g in node if g[2].startswith("pods")}
check(pod_grants == rules(ns, "", ["pods"], ["get"]),
      f"the node plugin evicts nothing, and reads only its namespace's pods: {sorted(pod_grants)}")
check(not [o for o in objs if o["metadata"]["name"] == "stickyvol-overflow-evictions"
           and o["kind"].startswith("ValidatingAdmissionPolicy")],
      "no policy for node evictions is left (the node plugin has no eviction right)")
fence = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
         and o["metadata"]["name"] == "stickyvol-controller-fence"]
check(len(fence) == 1, "the controller's fence is rendered")
if fence:
    spec = fence[0]["spec"]
    seen = {(r, op) for rule in spec["matchConstraints"]["resourceRules"]
            for r in rule["resources"] for op in rule["operations"]}
    check(("pods/eviction", "CREATE") in seen, "the controller's fence sees its evictions")
    check(("persistentvolumeclaims", "CREATE") in seen and ("persistentvolumeclaims", "DELETE") in seen,
          "the controller's fence sees the claims it creates and deletes")
    check(any("preconditions.uid" in v["expression"] and "gracePeriodSeconds" in v["expression"]
              for v in spec["validations"]),
          "the controller's fence wants the pod's uid and its own grace period")
    check({("configmaps", op) for op in ("CREATE", "UPDATE", "DELETE")} <= seen
          and any(f"'{driver}-released-' + object.data['node']" in v["expression"]
                  for v in spec["validations"]),
          "the controller's fence holds its ConfigMap writes to release notices")

# The node plugin's PVs, claims and snapshot contents: RBAC grants them cluster-wide, the policy
# holds each node to its own (pinned with the driver's topology key, of the driver's name).
volumes = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
           and o["metadata"]["name"] == "stickyvol-node-volumes"]
volumes_binding = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"
                   and o["spec"]["policyName"] == "stickyvol-node-volumes"]
check(len(volumes) == 1 and len(volumes_binding) == 1, "the node volumes policy and its binding are rendered")
if volumes and volumes_binding:
    spec = volumes[0]["spec"]
    check(spec["failurePolicy"] == "Fail", "the node volumes policy fails closed")
    check(volumes_binding[0]["spec"]["validationActions"] == ["Deny"], "the node volumes binding denies")
    seen = {(g, r, op) for rule in spec["matchConstraints"]["resourceRules"] for g in rule["apiGroups"]
            for r in rule["resources"] for op in rule["operations"]}
    written = {(g[1], g[2]) for g in node if g[3] in ("create", "update", "patch", "delete")
               and g[2] in ("persistentvolumes", "persistentvolumeclaims", "volumesnapshotcontents",
                            "volumesnapshotcontents/status")}
    check(all((group, resource, op) in seen for group, resource in written
              for op in ("CREATE", "UPDATE", "DELETE")),
          f"the node volumes policy sees every write RBAC grants: {sorted(written)}")
    expressions = " ".join(v["expression"] for v in spec["validations"])
    check(f"pv.spec.csi.driver == '{driver}'" in expressions
          and f"'topology.{driver}/node'" in expressions,
          f"the node volumes policy names {driver} and its topology key")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all RBAC checks pass")
