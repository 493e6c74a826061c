#!/usr/bin/env python3
"""Checks the container images by reading their Dockerfiles (the machine the
suite runs on has no container engine to build them).

Each image that can run the local sandbox must ship what warm mode needs
(local.mode: warm, the default): ci-zygote, built in the builder stage
(libpython3-dev) and copied into the same directory as the program that
looks for it beside itself, and libpython3.11, which it links, in the final
stage. The executor always runs the sandbox; the worker does with
WITH_RUNTIME=1.

usage: check_images.py --source DIR      exit 0 = good, 1 = a check failed
"""
import argparse
import os
import re
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")
    return cond


def stages(text):
    """The Dockerfile's stages, each the text from its FROM to the next."""
    text = re.sub(r"\\\n", " ", text)  # join continued lines
    parts = re.split(r"(?m)^FROM\s", text)
    return [p for p in parts[1:]]


def copied_into(stage, name):
    """Destination directories of COPY lines that copy /build/<name>."""
    dirs = []
    for m in re.finditer(r"(?m)^COPY\s+--from=\S+\s+(.+)$", stage):
        args = m.group(1).split()
        srcs, dst = args[:-1], args[-1]
        if f"/build/{name}" in srcs:
            dirs.append(dst if dst.endswith("/") or len(srcs) > 1 else os.path.dirname(dst) + "/")
    return dirs


def check_image(path, program):
    with open(path) as f:
        st = stages(f.read())
    if not check(len(st) >= 2, f"{path}: a builder stage and a final stage"):
        return
    build, final = st[0], st[-1]
    label = os.path.relpath(path)
    check("libpython3-dev" in build, f"{label}: the builder installs libpython3-dev (ci-zygote embeds CPython)")
    check(re.search(r"--target[^\n]*\bci-zygote\b", build) is not None, f"{label}: the builder builds ci-zygote")
    prog_dirs = copied_into(final, program)
    zyg_dirs = copied_into(final, "ci-zygote")
    check(bool(prog_dirs), f"{label}: the final stage copies {program}")
    check(bool(zyg_dirs) and set(prog_dirs) <= set(zyg_dirs),
          f"{label}: ci-zygote is copied beside {program} ({zyg_dirs or 'not copied'} vs {prog_dirs})")
    check(re.search(r"\blibpython3\.11\b", final) is not None,
          f"{label}: the final stage installs libpython3.11 (ci-zygote links it)")
    check(re.search(r"\bpython3-pandas\b", final) is not None, f"{label}: the final stage has the Python runtime")
    check(re.search(r"\bpython3-dill\b", final) is not None,
          f"{label}: the final stage installs python3-dill (the driver saves a session's state with it)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    check_image(os.path.join(a.source, "src/executor/Dockerfile"), "ci-executor")
    check_image(os.path.join(a.source, "src/worker/Dockerfile"), "ci-worker")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("images ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
