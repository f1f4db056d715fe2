#!/usr/bin/env python3
"""The crates compiled into the stickyvol binary (its normal dependencies, transitively, for
x86_64 Linux, from `cargo metadata`), written as a CycloneDX 1.5 SBOM and as the third-party
notices the crates' licenses ask a binary distribution to carry (each crate's own license and
notice files, verbatim).

    crates.py VERSION SBOM.json NOTICES.txt

Fails when a crate declares no license: such a crate cannot be shipped without a decision.
"""
import glob
import json
import os
import subprocess
import sys
import tomllib

TARGET = "x86_64-unknown-linux-gnu"
LICENSE_FILES = ("LICENSE*", "LICENCE*", "COPYING*", "NOTICE*", "UNLICENSE*")


def metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--locked", "--format-version", "1", "--filter-platform", TARGET],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def shipped(meta):
    """The packages the binary links: stickyvol and its normal dependencies, transitively."""
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(p["id"] for p in meta["packages"] if p["name"] == "stickyvol" and p["source"] is None)
    seen, todo = set(), [root]
    while todo:
        node = nodes[todo.pop()]
        if node["id"] in seen:
            continue
        seen.add(node["id"])
        for dep in node["deps"]:
            if any(kind["kind"] is None for kind in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    by_id = {p["id"]: p for p in meta["packages"]}
    return by_id[root], sorted((by_id[i] for i in seen if i != root), key=lambda p: (p["name"], p["version"]))


def lock_checksums():
    with open("Cargo.lock", "rb") as f:
        lock = tomllib.load(f)
    return {(p["name"], p["version"]): p["checksum"] for p in lock["package"] if "checksum" in p}


def sbom(root, crates, version):
    sums = lock_checksums()
    components = []
    for p in crates:
        component = {
            "type": "library",
            "bom-ref": f"pkg:cargo/{p['name']}@{p['version']}",
            "name": p["name"],
            "version": p["version"],
            "purl": f"pkg:cargo/{p['name']}@{p['version']}",
            "licenses": [{"expression": p["license"]}],
        }
        if (p["name"], p["version"]) in sums:
            component["hashes"] = [{"alg": "SHA-256", "content": sums[(p["name"], p["version"])]}]
        components.append(component)
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "component": {
                "type": "application",
                "bom-ref": f"pkg:cargo/stickyvol@{version}",
                "name": "stickyvol",
                "version": version,
                "licenses": [{"expression": root["license"]}],
            }
        },
        "components": components,
        "dependencies": [
            {"ref": f"pkg:cargo/stickyvol@{version}", "dependsOn": [c["bom-ref"] for c in components]}
        ],
    }


def notices(crates):
    parts = [
        "Third-party notices for stickyvol: the crates compiled into the binary, each with its\n"
        "declared license and the license and notice files it carries.\n"
    ]
    for p in crates:
        crate_dir = os.path.dirname(p["manifest_path"])
        files = sorted({f for pattern in LICENSE_FILES for f in glob.glob(os.path.join(crate_dir, pattern))})
        parts.append(f"\n{'=' * 78}\n{p['name']} {p['version']} ({p['license']})\n{'=' * 78}\n")
        if not files:
            parts.append("(the crate carries no license file; its license is the one declared above)\n")
        for path in files:
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    parts.append(f"--- {os.path.basename(path)}\n{f.read().rstrip()}\n")
    return "".join(parts)


def main():
    version, sbom_path, notices_path = sys.argv[1:]
    root, crates = shipped(metadata())
    unlicensed = [f"{p['name']} {p['version']}" for p in crates if not p.get("license")]
    if unlicensed:
        sys.exit(f"crates without a declared license: {', '.join(unlicensed)}")
    with open(sbom_path, "w", encoding="utf-8") as f:
        json.dump(sbom(root, crates, version), f, indent=1)
    with open(notices_path, "w", encoding="utf-8") as f:
        f.write(notices(crates))
    print(f"{len(crates)} crates in the binary: {sbom_path}, {notices_path}")


if __name__ == "__main__":
    main()
