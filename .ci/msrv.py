#!/usr/bin/env python3
"""Checks the minimum Rust of each feature set against what its dependencies declare.

It resolves the dependencies as a user on the stated minimum would (Cargo's
`incompatible-rust-versions = "fallback"`: the newest versions that declare a Rust no newer
than the crate's rust-version, where one exists), in a scratch lockfile: Cargo.lock is put back.

The crate declares rust-version 1.85; the `redis` features need 1.88 (redis-rs's minimum), as
Cargo.toml and the README say. This fails when a dependency of a feature set declares a newer
rust-version than the one stated for it (only one toolchain is installed here, so this reads
the declarations instead of building with an old compiler).
"""
import json, subprocess, sys

STATED = {"": "1.85", "test-util": "1.85", "redis": "1.88", "redis-cluster": "1.88"}

def version(v):
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))

import os, shutil
shutil.copy("Cargo.lock", "Cargo.lock.msrv-backup")
try:
    env = dict(os.environ, CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS="fallback")
    subprocess.check_call(["cargo", "generate-lockfile", "--quiet"], env=env)
    meta = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1", "--all-features"]))
    declared = {(p["name"], p["version"]): p.get("rust_version") for p in meta["packages"]}
    problems = []
    for features, stated in STATED.items():
        args = ["cargo", "tree", "-e", "normal,build", "--prefix", "none", "--format", "{p}"]
        if features:
            args += ["--features", features]
        for line in subprocess.check_output(args, text=True).splitlines():
            parts = line.split()
            if len(parts) < 2 or parts[0] == "reqwest-throttle":
                continue
            name, ver = parts[0], parts[1].lstrip("v")
            need = declared.get((name, ver))
            if need and version(need) > version(stated):
                problems.append(f"features [{features or 'default'}]: {name} {ver} needs Rust {need}, stated {stated}")
finally:
    shutil.move("Cargo.lock.msrv-backup", "Cargo.lock")
for p in sorted(set(problems)):
    print(p)
if problems:
    sys.exit("minimum Rust: the stated versions are too low")
print("minimum Rust: " + ", ".join(f"[{f or 'default'}] {v}" for f, v in STATED.items()) + ": every dependency agrees")
