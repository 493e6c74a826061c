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
  privileged and drops every capability; the local sandbox's procMount
  Unmasked (a fresh /proc in its namespaces) with hostUsers false, as the
  README says; a kubeVersion that has the appArmorProfile field;
- the cloudrun provider's pods (worker.provider: cloudrun runs no task
  code) get RuntimeDefault seccomp and AppArmor, no capability, no
  Unconfined and no unmasked /proc, and a cloudrun config passes
  --check-config; the Deployment picks the confinement by provider and runs
  as the chart's ServiceAccount (Workload Identity annotations);
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
    # The local sandbox mounts a fresh /proc in its pid namespace: the
    # kernel refuses that under a masked /proc, and Kubernetes allows an
    # unmasked one only in a pod with its own user namespace.
    check(sc.get("procMount") == "Unmasked",
          "securityContext.procMount is Unmasked (the local sandbox mounts a fresh /proc; README option 1)")
    check(v.get("hostUsers") is False, "hostUsers is false, which procMount: Unmasked needs")
    readme_path = os.path.join(chart, "README.md")
    if os.path.exists(readme_path):
        with open(readme_path) as f:
            rd = f.read()
        check("procMount: Unmasked" in rd and "hostUsers: false" in rd,
              "the README asks for procMount: Unmasked with hostUsers: false, as values.yaml sets")
    uses_apparmor_field = any("appArmorProfile" in (x or {}) for x in (psc, sc))
    kv = re.match(r">=\s*(\d+)\.(\d+)", str(c.get("kubeVersion", "")))
    check(kv is not None, f"Chart.yaml: kubeVersion has a lower bound ({c.get('kubeVersion')})")
    if kv and uses_apparmor_field:
        check((int(kv.group(1)), int(kv.group(2))) >= (1, 30),
              f"Chart.yaml: kubeVersion {c.get('kubeVersion')} admits clusters older than 1.30, "
              "which ignore securityContext.appArmorProfile")
    # The cloudrun provider's pods run no task code: the runtime's defaults.
    cpsc = v.get("cloudrunPodSecurityContext") or {}
    csc = v.get("cloudrunSecurityContext") or {}
    check((cpsc.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
          "cloudrunPodSecurityContext.seccompProfile is RuntimeDefault")
    check((cpsc.get("appArmorProfile") or {}).get("type") == "RuntimeDefault",
          "cloudrunPodSecurityContext.appArmorProfile is RuntimeDefault")
    check(csc.get("privileged") is False and csc.get("allowPrivilegeEscalation") is False,
          "cloudrunSecurityContext: not privileged, no privilege escalation")
    check((csc.get("capabilities") or {}).get("drop") == ["ALL"] and not (csc.get("capabilities") or {}).get("add"),
          "cloudrunSecurityContext drops every capability and adds none")
    check(csc.get("procMount") in (None, "Default"), "cloudrunSecurityContext keeps /proc masked")
    check(csc.get("readOnlyRootFilesystem") is True and cpsc.get("runAsNonRoot") is True,
          "cloudrun pods: read-only root, not root")
    check("Unconfined" not in yaml.safe_dump([cpsc, csc]), "cloudrun pods: nothing Unconfined")
    if isinstance(cfg, dict):
        crcfg = {k: dict(x) if isinstance(x, dict) else x for k, x in cfg.items()}
        crcfg["worker"] = dict(cfg.get("worker") or {}, provider="cloudrun")
        crcfg["cloudrun"] = dict(cfg.get("cloudrun") or {}, service_url="https://ci-executor-abc123-ew.a.run.app")
        eff3 = check_config(a.worker, crcfg, "values.config with provider cloudrun")
        if eff3:
            check(eff3["worker"]["provider"] == "cloudrun", "config with provider cloudrun")
    sa = v.get("serviceAccount") or {}
    check(isinstance(sa.get("create"), bool) and "name" in sa and isinstance(sa.get("annotations"), dict),
          "values: serviceAccount.create, .name, .annotations (Workload Identity)")
    keda = v.get("keda") or {}
    check(keda.get("enabled") is False and keda.get("maxReplicaCount", 0) >= keda.get("minReplicaCount", 1),
          "values: KEDA off by default, min <= max")

    # 4. Templates.
    tdir = os.path.join(chart, "templates")
    names = sorted(os.listdir(tdir))
    for want in ("deployment.yaml", "configmap.yaml", "pdb.yaml", "scaledobject.yaml", "serviceaccount.yaml",
                 "_helpers.tpl"):
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
    # The confinement follows the provider: the cloudrun pods never get the
    # sandbox's contexts, and hostUsers belongs to the sandbox's.
    check(re.search(r'\$cloudrun := include "ci-worker\.cloudrun" \.', dep) is not None
          and 'define "ci-worker.cloudrun"' in helpers
          and re.search(r'dig "worker" "provider" "local" \.Values\.config\)\) "cloudrun"', helpers) is not None,
          "templates: the provider (config.worker.provider) decides the pod's confinement")
    for sec, local_, cr in (("pod", "podSecurityContext", "cloudrunPodSecurityContext"),
                            ("container", "securityContext", "cloudrunSecurityContext")):
        pat = (r"\{\{-? if \$cloudrun \}\}\s*\{\{-? toYaml \.Values\." + cr + r" \| nindent \d+ \}\}\s*"
               r"\{\{-? else \}\}\s*\{\{-? toYaml \.Values\." + local_ + r" \| nindent \d+ \}\}\s*\{\{-? end \}\}")
        check(re.search(pat, dep) is not None,
              f"templates/deployment.yaml: the {sec} securityContext is {cr} for cloudrun, else {local_}")
    check(re.search(r'if and \(not \$cloudrun\) \(not \(kindIs "invalid" \.Values\.hostUsers\)\)', dep) is not None,
          "templates/deployment.yaml: hostUsers only for the local sandbox's pods")
    check("fail" in dep and "procMount" in dep and "hostUsers" in dep,
          "templates/deployment.yaml: refuses procMount Unmasked without hostUsers false")
    check('serviceAccountName: {{ include "ci-worker.serviceAccountName" . }}' in dep,
          "templates/deployment.yaml: the pods run as the chart's ServiceAccount")
    with open(os.path.join(tdir, "serviceaccount.yaml")) as f:
        sat = f.read()
    check(sat.lstrip().startswith("{{- if .Values.serviceAccount.create }}") and "kind: ServiceAccount" in sat
          and ".Values.serviceAccount.annotations" in sat
          and 'name: {{ include "ci-worker.serviceAccountName" . }}' in sat,
          "templates/serviceaccount.yaml: created when serviceAccount.create, with its annotations")
    with open(os.path.join(tdir, "scaledobject.yaml")) as f:
        so = f.read()
    check("type: nats-jetstream" in so and "lagThreshold" in so and "consumer" in so,
          "templates/scaledobject.yaml: a nats-jetstream trigger on the consumer's lag")
    # One trigger per lane (contract §21): the interactive consumer and the
    # batch consumer, each with its own threshold.
    triggers = so.split("- type: ")[1:]
    check(len(triggers) == 2 and all(t.startswith("nats-jetstream") for t in triggers),
          f"templates/scaledobject.yaml: two nats-jetstream triggers ({len(triggers)})")
    if len(triggers) == 2:
        check('.Values.config.jetstream.tasks_stream | default "CI_TASKS"' in triggers[0]
              and '.Values.config.jetstream.consumer | default "ci-workers"' in triggers[0]
              and ".Values.keda.lagThreshold" in triggers[0],
              "templates/scaledobject.yaml: the first trigger is the interactive consumer's lag")
        check('.Values.config.jetstream.batch_stream | default "CI_BATCH"' in triggers[1]
              and '.Values.config.jetstream.batch_consumer | default "ci-workers-batch"' in triggers[1]
              and ".Values.keda.batchLagThreshold" in triggers[1],
              "templates/scaledobject.yaml: the second trigger is the batch consumer's lag")
    if eff:
        check(eff["jetstream"]["batch_stream"] == "CI_BATCH" and eff["jetstream"]["batch_consumer"] == "ci-workers-batch",
              "values.config keeps the batch lane's names the triggers default to")
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
