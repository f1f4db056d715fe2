#!/usr/bin/env python3
"""Checks a rendering of the chart: the admin socket of every `stickyvol serve` that serves the
admin API (modes all and node) lies in a volume mounted into that container alone. The sidecars
share the CSI socket's directory as root; none of them, and no other container of the pod, may
mount the admin socket's volume, nor a hostPath that holds its host directory or lies in it.
tests/deploy_manifests.rs checks deploy/ the same way.

    admin_socket.py RENDERED.yaml
"""
import posixpath
import sys

import yaml

DEFAULT_ADMIN_SOCKET = "/run/stickyvol-admin/admin.sock"  # src/config.rs
failures = []
checked = 0


def flag(container, name):
    for arg in container.get("args", []):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def admin_socket(container):
    """The admin socket a serve container uses, or None where no admin API is served."""
    args = container.get("args", [])
    if not args or args[0] != "serve":
        return None
    mode = flag(container, "--mode") or next(
        (e.get("value") for e in container.get("env", []) if e["name"] == "STICKYVOL_MODE"), "all")
    if mode == "controller":
        return None
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    return flag(container, "--admin-socket") or env.get("ADMIN_SOCKET") or DEFAULT_ADMIN_SOCKET


def within(path, directory):
    """Whether `path` is `directory` or lies beneath it, by path components."""
    path, directory = posixpath.normpath(path), posixpath.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def check_pod(where, spec):
    global checked
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
    containers = spec.get("initContainers", []) + spec.get("containers", [])
    for container in containers:
        socket = admin_socket(container)
        if socket is None:
            continue
        checked += 1
        at = f"{where} container {container['name']}"
        holding = [m for m in container.get("volumeMounts", []) if within(socket, m["mountPath"])]
        if not holding:
            failures.append(f"{at}: no volumeMount holds the admin socket {socket}")
            continue
        volume = max(holding, key=lambda m: len(m["mountPath"]))["name"]
        ours = host_paths.get(volume)
        for other in containers:
            if other is container:
                continue
            for mount in other.get("volumeMounts", []):
                theirs = host_paths.get(mount["name"])
                overlapping = ours and theirs and (within(ours, theirs) or within(theirs, ours))
                if mount["name"] == volume or overlapping:
                    failures.append(f"{at}: the admin socket {socket} is in volume {volume}, and "
                                    f"container {other['name']} mounts {mount['name']}")


with open(sys.argv[1]) as f:
    for obj in (d for d in yaml.safe_load_all(f) if d):
        if obj["kind"] in ("DaemonSet", "StatefulSet", "Deployment"):
            check_pod(f"{obj['kind']} {obj['metadata']['name']}", obj["spec"]["template"]["spec"])

for failure in failures:
    print("FAIL " + failure)
if not checked:
    print("FAIL no stickyvol container serving the admin API in " + sys.argv[1])
    sys.exit(1)
print(f"{checked} admin socket(s) checked, {len(failures)} problem(s)")
sys.exit(1 if failures else 0)
