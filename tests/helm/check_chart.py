#!/usr/bin/env python3
"""Checks the Helm chart without a helm binary.

- every non-template YAML file of the chart parses, and Chart.yaml has what
  Helm 3 needs (apiVersion v2, name, version, appVersion, the NATS
  dependency behind nats.enabled);
- the worker config in values.yaml (`config:`), rendered as the ConfigMap
  renders it (toYaml of the map, plus the creds path when natsAuth.credsKey
  is set), is accepted by `ci-worker --check-config`, and the effective
  config it prints has the values the chart relies on;
- the values agree with each other: grace period > drain timeout > longest
  task, metrics port everywhere the same, memory limit >= what concurrency
  tasks may use, CPU limit = concurrency, a securityContext that is not
  privileged and drops every capability;
- the templates are well formed: balanced {{ }}, one {{ end }} per block,
  and every .Values path they read exists in values.yaml (a typo there
  would render silently as empty).

usage: check_chart.py --chart helm/ci-worker --worker build/ci-worker
Exit 0 = all good, 1 = a check failed (each is printed), 77 = no PyYAML.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed (scripts/install-deps.sh installs it)")
    sys.exit(77)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")
    return cond


def mib(quantity):
    """Kubernetes memory quantity -> MiB."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G)?", str(quantity))
    if not m:
        raise ValueError(f"unsupported quantity {quantity!r}")
    n, unit = int(m.group(1)), m.group(2) or ""
    factor = {"": 1 / 2**20, "Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 2**20,
              "k": 1000 / 2**20, "M": 1e6 / 2**20, "G": 1e9 / 2**20}[unit]
    return n * factor


def check_config(worker, cfg, label):
    """Writes cfg as the ConfigMap would and runs ci-worker --check-config."""
    text = yaml.safe_dump(cfg, default_flow_style=False, sort_keys=False)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="worker-", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        env = {k: v for k, v in os.environ.items() if k != "CI_NATS_URL"}
        r = subprocess.run([worker, "--check-config", "--config", path], capture_output=True,
                           text=True, timeout=60, env=env)
    finally:
        os.unlink(path)
    if not check(r.returncode == 0, f"{label}: ci-worker --check-config refused it: {r.stderr.strip()}\n{text}"):
        return None
    return yaml.safe_load(r.stdout)


def get_path(d, path):
    for part in path:
        if not isinstance(d, dict) or part not in d:
            return None, False
        d = d[part]
    return d, True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chart", required=True)
    ap.add_argument("--worker", required=True)
    a = ap.parse_args()
    chart = a.chart

    # 1. Every non-template YAML file parses.
    docs = {}
    for root, dirs, files in os.walk(chart):
        if os.path.relpath(root, chart).split(os.sep)[0] == "templates":
            continue
        for name in files:
            if name.endswith((".yaml", ".yml")):
                p = os.path.join(root, name)
                try:
                    with open(p) as f:
                        docs[os.path.relpath(p, chart)] = yaml.safe_load(f)
                except yaml.YAMLError as e:
                    check(False, f"{p} is not valid YAML: {e}")
    check("Chart.yaml" in docs and "values.yaml" in docs, "Chart.yaml and values.yaml exist")
    c = docs.get("Chart.yaml") or {}
    v = docs.get("values.yaml") or {}
    check(c.get("apiVersion") == "v2", "Chart.yaml: apiVersion v2 (Helm 3)")
    check(c.get("name") == os.path.basename(os.path.normpath(chart)), "Chart.yaml: name is the chart's folder")
    check(re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", str(c.get("version", ""))) is not None,
          "Chart.yaml: version is SemVer 2")
    check(bool(c.get("appVersion")), "Chart.yaml: appVersion")
    deps = {d.get("name"): d for d in c.get("dependencies") or []}
    check("nats" in deps and deps["nats"].get("condition") == "nats.enabled"
          and str(deps["nats"].get("repository", "")).startswith("https://nats-io.github.io/"),
          "Chart.yaml: the official NATS chart as a dependency behind nats.enabled")
    nats = v.get("nats") or {}
    ncfg = nats.get("config") or {}
    check(nats.get("enabled") is False, "values: the NATS subchart is off by default")
    check((ncfg.get("cluster") or {}).get("replicas") == 3 and (ncfg.get("cluster") or {}).get("enabled") is True,
          "values: the NATS subchart runs a 3-node cluster")
    js = ncfg.get("jetstream") or {}
    check(js.get("enabled") is True and (js.get("fileStore") or {}).get("enabled") is True,
          "values: the NATS subchart has JetStream on file storage")

    # 2. The worker config, as the ConfigMap renders it.
    cfg = v.get("config")
    check(isinstance(cfg, dict), "values: config is a map (the worker's config)")
    eff = check_config(a.worker, cfg, "values.config") if isinstance(cfg, dict) else None
    if eff:
        port = v.get("metricsPort")
        check(eff["worker"]["metrics_addr"] == f"0.0.0.0:{port}",
              f"config worker.metrics_addr listens on every address at metricsPort ({eff['worker']['metrics_addr']})")
        check(eff["jetstream"]["replicas"] == 3, "config: R3 streams, KV and object store")
        check(eff["local"]["isolation"] == "required", "config: local.isolation required in production")
        check(eff["worker"]["concurrency"] > 0, "config: worker.concurrency set (0 would be the node's CPUs)")
        check(eff["worker"]["heartbeat_s"] > 0, "config: heartbeats on (ci stats)")
        # With the credentials Secret, the helper adds the mounted paths.
        with_creds = dict(cfg)
        with_creds["nats"] = dict(cfg.get("nats") or {}, creds_file="/etc/ci-nats/creds",
                                  nkey_seed_file="/etc/ci-nats/nkey")
        eff2 = check_config(a.worker, with_creds, "values.config with natsAuth")
        if eff2:
            check(eff2["nats"]["creds_file"] == "/etc/ci-nats/creds", "config with natsAuth: creds_file")

        # 3. Values that must agree.
        grace = v.get("terminationGracePeriodSeconds")
        drain = eff["worker"]["drain_timeout_s"]
        longest = eff["limits"]["max_timeout_ms"] / 1000
        check(grace > drain, f"terminationGracePeriodSeconds ({grace}) > worker.drain_timeout_s ({drain})")
        check(drain > longest, f"worker.drain_timeout_s ({drain}) > the longest task ({longest} s)")
        ann = v.get("podAnnotations") or {}
        check(str(ann.get("prometheus.io/port")) == str(port), "podAnnotations prometheus.io/port = metricsPort")
        res = v.get("resources") or {}
        lim = res.get("limits") or {}
        conc = eff["worker"]["concurrency"]
        need = conc * (eff["limits"]["max_memory_mb"] + eff["local"]["workspace_mb"] + 2 * eff["local"]["tmp_mb"])
        check(mib(lim.get("memory", "0")) >= need,
              f"resources.limits.memory ({lim.get('memory')}) holds {conc} tasks at their limits ({need} MiB)")
        check(str(lim.get("cpu")) == str(conc), f"resources.limits.cpu ({lim.get('cpu')}) = worker.concurrency ({conc})")
    sc = v.get("securityContext") or {}
    check(sc.get("privileged") is False, "securityContext.privileged is false")
    check((sc.get("capabilities") or {}).get("drop") == ["ALL"], "securityContext drops every capability")
    check(sc.get("allowPrivilegeEscalation") is False, "securityContext.allowPrivilegeEscalation is false")
    psc = v.get("podSecurityContext") or {}
    check((psc.get("seccompProfile") or {}).get("type") in ("Unconfined", "Localhost"),
          "podSecurityContext.seccompProfile lets the sandbox make namespaces (Unconfined or Localhost)")
    keda = v.get("keda") or {}
    check(keda.get("enabled") is False and keda.get("maxReplicaCount", 0) >= keda.get("minReplicaCount", 1),
          "values: KEDA off by default, min <= max")

    # 4. Templates.
    tdir = os.path.join(chart, "templates")
    names = sorted(os.listdir(tdir))
    for want in ("deployment.yaml", "configmap.yaml", "pdb.yaml", "scaledobject.yaml", "_helpers.tpl"):
        check(want in names, f"templates/{want} exists")
    for name in names:
        with open(os.path.join(tdir, name)) as f:
            t = f.read()
        check(t.count("{{") == t.count("}}"), f"templates/{name}: balanced {{{{ }}}}")
        actions = re.findall(r"\{\{-?\s*(\w+)", t)
        opens = sum(1 for x in actions if x in ("if", "with", "range", "define"))
        ends = sum(1 for x in actions if x == "end")
        check(opens == ends, f"templates/{name}: {opens} blocks, {ends} ends")
        for m in re.finditer(r"\.Values((?:\.[A-Za-z0-9_]+)+)(\s*\|\s*default)?", t):
            if m.group(2):
                continue  # optional, with a default
            path = m.group(1).strip(".").split(".")
            _, ok = get_path(v, path)
            check(ok, f"templates/{name}: .Values.{'.'.join(path)} is not in values.yaml")
    with open(os.path.join(tdir, "configmap.yaml")) as f:
        cm = f.read()
    with open(os.path.join(tdir, "_helpers.tpl")) as f:
        helpers = f.read()
    check('include "ci-worker.config"' in cm and "toYaml $cfg" in helpers and "deepCopy .Values.config" in helpers,
          "the ConfigMap is values.config through toYaml (what this script renders)")
    with open(os.path.join(tdir, "deployment.yaml")) as f:
        dep = f.read()
    for what in ("checksum/config", "terminationGracePeriodSeconds", "livenessProbe", "readinessProbe",
                 "path: /healthz", "path: /readyz", "secretKeyRef", "resources:", "securityContext:"):
        check(what in dep, f"templates/deployment.yaml has {what}")
    with open(os.path.join(tdir, "scaledobject.yaml")) as f:
        so = f.read()
    check("type: nats-jetstream" in so and "lagThreshold" in so and "consumer" in so,
          "templates/scaledobject.yaml: a nats-jetstream trigger on the consumer's lag")
    readme = os.path.join(chart, "README.md")
    check(os.path.exists(readme), "the chart has a README")
    if os.path.exists(readme):
        with open(readme) as f:
            r = f.read()
        for word in ("helm install", "helm upgrade", "scale"):
            check(word in r, f"README shows {word}")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("chart ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
