#!/usr/bin/env python3
"""The pod-start benchmark (tests/e2e/run pod-start): N claim+pod pairs applied at once.

    pod_start.py KUBECTL NAMESPACE_PREFIX PAUSE_IMAGE N[,N...] VARIANT...

A VARIANT is "emptyDir" (the same pods with an emptyDir, the baseline) or the name of a
StorageClass (WaitForFirstConsumer: the claim is provisioned once its pod is scheduled). For each
N and variant, in a namespace of its own: the start of `kubectl apply` is t0; a pod's start is
the moment the watch sees it Running; then every pod and claim is deleted at once (t1) and a
pod's end is the moment the watch sees it gone. Prints, per N and variant, the p50 and p99 of
start and end times and the pods per second of the batch (N / the last start), then
"pod start p50: stickyvol X ms, emptyDir Y ms, ratio Z" for the last N, when both were run.
The pods run PAUSE_IMAGE (it exits at once on SIGTERM) and request little, so that kubelet's
and the driver's work is what is measured, not the container's.
"""
import json
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
    """kubectl get pods --watch, each event stamped with the time it arrived."""

    def __init__(self, kubectl, namespace):
        self.running, self.gone = {}, {}
        self.proc = subprocess.Popen(
            [kubectl, "-n", namespace, "get", "pods", "--watch", "--output-watch-events",
             "-o", "json"],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

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
                pod = event.get("object", {})
                name = pod.get("metadata", {}).get("name")
                if event.get("type") == "DELETED":
                    self.gone.setdefault(name, now)
                elif pod.get("status", {}).get("phase") == "Running":
                    self.running.setdefault(name, now)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def manifests(n, variant, pause_image):
    docs = []
    for i in range(n):
        if variant == "emptyDir":
            volume = {"name": "data", "emptyDir": {}}
        else:
            docs.append({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"data-{i}"},
                "spec": {"storageClassName": variant, "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": CLAIM_SIZE}}},
            })
            volume = {"name": "data", "persistentVolumeClaim": {"claimName": f"data-{i}"}}
        docs.append({
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
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"pod-start: timed out waiting for {what}")
        time.sleep(0.1)


def batch(kubectl, namespace, n, variant, pause_image):
    subprocess.run([kubectl, "create", "namespace", namespace], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        # The namespace's default ServiceAccount comes a moment after it: wait for it, as
        # the pods need it.
        wait_for("the default ServiceAccount", lambda: subprocess.run(
            [kubectl, "-n", namespace, "get", "serviceaccount", "default"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0, 60)
        watch = Watch(kubectl, namespace)
        time.sleep(1)  # the watch is established
        body = manifests(n, variant, pause_image)
        t0 = time.monotonic()
        subprocess.run([kubectl, "-n", namespace, "apply", "-f", "-"], input=body, text=True,
                       check=True, stdout=subprocess.DEVNULL)
        wait_for(f"{n} pods Running ({variant})", lambda: len(watch.running) >= n, 600)
        starts = [(t - t0) * 1000 for t in watch.running.values()]
        t1 = time.monotonic()
        subprocess.run([kubectl, "-n", namespace, "delete", "pods,pvc", "--all", "--wait=false"],
                       check=True, stdout=subprocess.DEVNULL)
        wait_for(f"{n} pods gone ({variant})", lambda: len(watch.gone) >= n, 600)
        ends = [(t - t1) * 1000 for t in watch.gone.values()]
        watch.stop()
    finally:
        subprocess.run([kubectl, "delete", "namespace", namespace, "--wait=true",
                        "--timeout=300s"], stdout=subprocess.DEVNULL)
    return starts, ends


def main():
    kubectl, prefix, pause_image, counts, variants = (
        sys.argv[1], sys.argv[2], sys.argv[3], [int(c) for c in sys.argv[4].split(",")],
        sys.argv[5:])
    print(f"{'pods':>5} {'volume':<20} {'start p50':>10} {'start p99':>10} "
          f"{'gone p50':>10} {'gone p99':>10} {'pods/s':>7}")
    p50 = {}
    for n in counts:
        for variant in variants:
            starts, ends = batch(kubectl, f"{prefix}-{variant.lower()}-{n}", n, variant,
                                 pause_image)
            p50[variant] = percentile(starts, 50)
            print(f"{n:>5} {variant:<20} {p50[variant]:>8.0f}ms "
                  f"{percentile(starts, 99):>8.0f}ms {percentile(ends, 50):>8.0f}ms "
                  f"{percentile(ends, 99):>8.0f}ms {n / (max(starts) / 1000):>7.1f}", flush=True)
    if "stickyvol" in p50 and "emptyDir" in p50:
        print(f"pod start p50: stickyvol {p50['stickyvol']:.0f} ms, emptyDir "
              f"{p50['emptyDir']:.0f} ms, ratio {p50['stickyvol'] / p50['emptyDir']:.2f}")


if __name__ == "__main__":
    main()
