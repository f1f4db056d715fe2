#!/usr/bin/env python3
"""The pod-start benchmark (tests/e2e/run pod-start): N claim+pod pairs applied at once.

    pod_start.py KUBECTL NAMESPACE_PREFIX PAUSE_IMAGE N[,N...] VARIANT...

A VARIANT is "emptyDir" (the same pods with an emptyDir, the baseline) or the name of a
StorageClass (WaitForFirstConsumer: the claim is provisioned once its pod is scheduled). For each
N and variant, in a namespace of its own: the claims are applied first (a WaitForFirstConsumer
claim waits for its pod, so nothing is provisioned yet), then the start of `kubectl apply` of
the pods is t0; a pod's start is the moment the watch sees it Running; then every pod and claim
is deleted at once (t1) and a pod's end is the moment the watch sees it gone. Prints, per N and
variant, the p50 and p99 of start and end times and the pods per second of the batch (N / the
last start), and a line with the p50/p90/max of the start and of the claims' binding, then "pod start p50: stickyvol X ms, emptyDir Y ms, ratio Z" for the last N, when
both were run. The pods run PAUSE_IMAGE (it exits at once on SIGTERM) and request little, so
that kubelet's and the driver's work is what is measured, not the container's.

With ROUNDS > 1 (env E2E_POD_START_ROUNDS), every N is measured ROUNDS times with the variants
interleaved (emptyDir, stickyvol, …, emptyDir, stickyvol, …), so a slow spell of the machine
hits every variant alike; the final line then gives the median of the rounds' p50s.

Where the time goes, per batch (p50 of each pod's phase, from the same watches): "created", t0
to the pod's creation (kubectl creates a list's objects one by one); "scheduled", t0 to the pod
bound to a node (for a WaitForFirstConsumer claim this includes provisioning: the scheduler
binds the pod only once its claims are bound); "kubelet", bound to Running; and for claims, t0
to the scheduler's node choice (the selected-node annotation), to the PersistentVolume made (the
node's csi-provisioner: CreateVolume and the PV's creation), to the claim naming it (the PV
controller of kube-controller-manager binds) and to Bound.
"""
import json
import os
import statistics
import subprocess
import sys
import threading
import time

CLAIM_SIZE = "16Mi"


def percentile(values, p):
    ordered = sorted(values)
    # nearest rank
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


class Watch:
    """kubectl get KIND --watch, each object's first sighting of each state stamped with the
    time the event arrived: pods Running, bound to a node and gone; claims with a selected
    node, naming their volume and Bound; PersistentVolumes made for a claim of the namespace
    (stamped under the claim's name)."""

    SELECTED_NODE = "volume.kubernetes.io/selected-node"

    def __init__(self, kubectl, namespace, kind):
        self.namespace, self.pvs = namespace, kind == "pv"
        self.seen = {state: {} for state in
                     ("created", "scheduled", "running", "gone", "selected", "named", "bound")}
        self.proc = subprocess.Popen(
            [kubectl, "-n", namespace, "get", kind, "--watch", "--output-watch-events",
             "-o", "json"],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _mark(self, state, name, now):
        self.seen[state].setdefault(name, now)

    def _read(self):
        decoder, buf = json.JSONDecoder(), ""
        for line in self.proc.stdout:
            buf += line
            while buf.strip():
                try:
                    event, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break
                buf = buf.lstrip()[end:]
                now = time.monotonic()
                obj = event.get("object", {})
                name = obj.get("metadata", {}).get("name")
                if self.pvs:
                    # Cluster-wide: only the volumes of this namespace's claims, by claim.
                    ref = obj.get("spec", {}).get("claimRef") or {}
                    if ref.get("namespace") != self.namespace:
                        continue
                    name = ref.get("name")
                status = obj.get("status", {})
                if event.get("type") == "DELETED":
                    self._mark("gone", name, now)
                    continue
                self._mark("created", name, now)
                if obj.get("spec", {}).get("nodeName"):
                    self._mark("scheduled", name, now)
                if status.get("phase") == "Running":
                    self._mark("running", name, now)
                if self.SELECTED_NODE in obj.get("metadata", {}).get("annotations", {}):
                    self._mark("selected", name, now)
                if not self.pvs and obj.get("spec", {}).get("volumeName"):
                    self._mark("named", name, now)
                if status.get("phase") == "Bound":
                    self._mark("bound", name, now)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def manifests(n, variant, pause_image):
    """(the claims, the pods), each a kubectl List; no claims for emptyDir."""
    claims, pods = [], []
    for i in range(n):
        if variant == "emptyDir":
            volume = {"name": "data", "emptyDir": {}}
        else:
            claims.append({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"data-{i}"},
                "spec": {"storageClassName": variant, "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": CLAIM_SIZE}}},
            })
            volume = {"name": "data", "persistentVolumeClaim": {"claimName": f"data-{i}"}}
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"pod-{i}", "labels": {"pod-start": "yes"}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": "app", "image": pause_image,
                    "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }],
                "volumes": [volume],
            },
        })
    return tuple(json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
                 for items in (claims, pods))


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"pod-start: timed out waiting for {what}")
        time.sleep(0.1)


def since(t0, stamps):
    """Milliseconds from t0 to each stamp."""
    return [(t - t0) * 1000 for t in stamps.values()]


def batch(kubectl, namespace, n, variant, pause_image):
    """One batch: (start times, end times, phases, bind times), in ms; phases maps a phase to
    its p50; bind times (t0 to each claim Bound) are empty for emptyDir."""
    subprocess.run([kubectl, "create", "namespace", namespace], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        # The namespace's default ServiceAccount comes a moment after it: wait for it, as
        # the pods need it.
        wait_for("the default ServiceAccount", lambda: subprocess.run(
            [kubectl, "-n", namespace, "get", "serviceaccount", "default"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0, 60)
        pods = Watch(kubectl, namespace, "pods")
        claims = Watch(kubectl, namespace, "pvc") if variant != "emptyDir" else None
        volumes = Watch(kubectl, namespace, "pv") if variant != "emptyDir" else None
        time.sleep(1)  # the watches are established
        claim_list, pod_list = manifests(n, variant, pause_image)
        if claims:
            # The claims go in first, and the clock starts with the pods: kubectl applies a
            # list one object at a time, so pairs would take twice as long to submit as the
            # emptyDir pods, and that would be kubectl's time. A WaitForFirstConsumer claim
            # waits for its pod, so none of the provisioning happens before t0.
            subprocess.run([kubectl, "-n", namespace, "apply", "-f", "-"], input=claim_list,
                           text=True, check=True, stdout=subprocess.DEVNULL)
            wait_for(f"{n} claims", lambda: len(claims.seen["created"]) >= n, 120)
        t0 = time.monotonic()
        subprocess.run([kubectl, "-n", namespace, "apply", "-f", "-"], input=pod_list,
                       text=True, check=True, stdout=subprocess.DEVNULL)
        wait_for(f"{n} pods Running ({variant})", lambda: len(pods.seen["running"]) >= n, 600)
        running, scheduled = pods.seen["running"], pods.seen["scheduled"]
        starts = since(t0, running)
        phases = {"created": percentile(since(t0, pods.seen["created"]), 50),
                  "scheduled": percentile(since(t0, scheduled), 50),
                  "kubelet": percentile([(running[p] - scheduled[p]) * 1000
                                         for p in running if p in scheduled], 50)}
        binds = []
        if claims:
            binds = since(t0, claims.seen["bound"])
            phases["claim node chosen"] = percentile(since(t0, claims.seen["selected"]), 50)
            phases["PV made"] = percentile(since(t0, volumes.seen["created"]), 50)
            phases["claim names PV"] = percentile(since(t0, claims.seen["named"]), 50)
            phases["claim bound"] = percentile(since(t0, claims.seen["bound"]), 50)
            claims.stop()
            volumes.stop()
        t1 = time.monotonic()
        subprocess.run([kubectl, "-n", namespace, "delete", "pods,pvc", "--all", "--wait=false"],
                       check=True, stdout=subprocess.DEVNULL)
        wait_for(f"{n} pods gone ({variant})", lambda: len(pods.seen["gone"]) >= n, 600)
        ends = since(t1, pods.seen["gone"])
        pods.stop()
    finally:
        subprocess.run([kubectl, "delete", "namespace", namespace, "--wait=true",
                        "--timeout=300s"], stdout=subprocess.DEVNULL)
    return starts, ends, phases, binds


def spread(values):
    """p50/p90/max of values in ms, in seconds."""
    return "/".join(f"{v / 1000:.1f}" for v in
                    (percentile(values, 50), percentile(values, 90), max(values)))


def main():
    kubectl, prefix, pause_image, counts, variants = (
        sys.argv[1], sys.argv[2], sys.argv[3], [int(c) for c in sys.argv[4].split(",")],
        sys.argv[5:])
    rounds = int(os.environ.get("E2E_POD_START_ROUNDS", "1"))
    print(f"{'pods':>5} {'round':>5} {'volume':<20} {'start p50':>10} {'start p99':>10} "
          f"{'gone p50':>10} {'gone p99':>10} {'pods/s':>7}  phases p50")
    p50s = {}
    for n in counts:
        p50s = {variant: [] for variant in variants}
        for round_no in range(1, rounds + 1):
            for variant in variants:
                starts, ends, phases, binds = batch(
                    kubectl, f"{prefix}-{variant.lower()}-{n}-{round_no}", n, variant,
                    pause_image)
                p50s[variant].append(percentile(starts, 50))
                where = ", ".join(f"{k} {v:.0f}ms" for k, v in phases.items())
                print(f"{n:>5} {round_no:>5} {variant:<20} {p50s[variant][-1]:>8.0f}ms "
                      f"{percentile(starts, 99):>8.0f}ms {percentile(ends, 50):>8.0f}ms "
                      f"{percentile(ends, 99):>8.0f}ms {n / (max(starts) / 1000):>7.1f}  "
                      f"{where}", flush=True)
                print(f"{'':>11} {variant:<20} start p50/p90/max {spread(starts)} s"
                      + (f", claims Bound p50/p90/max {spread(binds)} s" if binds else ""),
                      flush=True)
        if rounds > 1:
            for variant in variants:
                ratios = ""
                if variant != "emptyDir" and "emptyDir" in p50s:
                    ratios = ", per round / emptyDir: " + " ".join(
                        f"{a / b:.2f}" for a, b in zip(p50s[variant], p50s["emptyDir"]))
                print(f"{n:>5} median {variant:<20} {statistics.median(p50s[variant]):>8.0f}ms"
                      f"{ratios}", flush=True)
    if "stickyvol" in p50s and "emptyDir" in p50s:
        ours, base = statistics.median(p50s["stickyvol"]), statistics.median(p50s["emptyDir"])
        print(f"pod start p50: stickyvol {ours:.0f} ms, emptyDir {base:.0f} ms, "
              f"ratio {ours / base:.2f}")


if __name__ == "__main__":
    main()
