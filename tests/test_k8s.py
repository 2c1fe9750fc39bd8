"""Offline checks of the Kubernetes manifests (deploy/k8s/): every resource
validates against the Kubernetes JSON schemas (kubernetes-validate, which
ships them; no cluster, no network), the KEDA ScaledObject against its
schema (deploy/k8s/schemas/keda-scaledobject.json), and the manifests agree
with the code they run: real `asynch` commands and ASYNCH_ settings, secrets
only from the Secrets docs/operations.md tells the operator to create, probes
on /healthz and /readyz, two beats, PodDisruptionBudgets that select real
pods, requests from the measured RSS, a migration Job, every process
through PgBouncer, and an autoscaler on metrics /metrics/cluster exports."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml
from test_compose import ASYNCH_VAR, real_env_vars, resolve_asynch

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
OPERATIONS = ROOT / "docs" / "operations.md"
K8S_VERSION = "1.30"
# Measured RSS per process (docs/performance.md): API ~80 MB (target 120), worker ~83 MB (target 150).
RSS_MI = {"api": 80, "worker": 83}


def _load() -> list[dict]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return _load()


def _by(docs, kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _containers(doc: dict) -> list[dict]:
    spec = doc["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def documented_secret(name: str) -> dict[str, str]:
    """The keys and values of `kubectl ... create secret generic <name>` in
    docs/operations.md (the manifests ship no Secret: the operator creates it)."""
    text = OPERATIONS.read_text().replace("\\\n", " ")
    lines = [ln for ln in text.splitlines() if re.search(rf"create secret generic {name}\b", ln)]
    assert len(lines) == 1, f"docs/operations.md must show `kubectl create secret generic {name} ...` once"
    pairs = re.findall(r'--from-literal=([A-Z0-9_]+)=("(?:[^"\\]|\\.)*"|\S+)', lines[0])
    assert pairs, lines[0]
    return {k: v.strip('"') for k, v in pairs}


def _keda_schema() -> dict:
    return json.loads((K8S / "schemas" / "keda-scaledobject.json").read_text())


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def test_every_resource_validates_against_the_kubernetes_schemas(docs):
    keda = _keda_schema()
    kinds = set()
    for d in docs:
        kinds.add(d["kind"])
        if d["kind"] == "ScaledObject":
            jsonschema.validate(d, keda)
        else:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    assert {"Deployment", "Job", "PodDisruptionBudget", "Service", "ConfigMap", "ScaledObject"} <= kinds
    assert "Secret" not in kinds, "the manifests ship no Secret: the operator creates them (docs/operations.md)"


def test_the_validators_refuse_a_broken_manifest(docs):
    """Not vacuous: a misspelt field and a missing required one are refused."""
    api = copy.deepcopy(_by(docs, "Deployment")["asynch-api"])
    api["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, K8S_VERSION, strict=True)
    so = copy.deepcopy(_by(docs, "ScaledObject")["asynch-worker"])
    del so["spec"]["scaleTargetRef"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(so, _keda_schema())


def test_our_containers_run_real_commands_and_settings(docs):
    cfg = _by(docs, "ConfigMap")["asynch-config"]["data"]
    secret = documented_secret("asynch-secrets")
    named = set(cfg) | set(secret)
    for d in docs:
        named |= set(ASYNCH_VAR.findall(yaml.safe_dump(d)))
    assert named - real_env_vars() <= {k for k in named if not k.startswith("ASYNCH_")}, \
        f"unknown settings: {sorted(n for n in named - real_env_vars() if n.startswith('ASYNCH_'))}"
    ours = 0
    for d in docs:
        if d["kind"] not in ("Deployment", "Job"):
            continue
        for c in _containers(d):
            if c.get("image") == "model-asynch":
                ours += 1
                resolve_asynch(c["command"])
                refs = {r.get("configMapRef", r.get("secretRef", {})).get("name") for r in c.get("envFrom", [])}
                assert refs == {"asynch-config", "asynch-secrets"}, f"{d['metadata']['name']}: envFrom {refs}"
    assert ours == 5  # migrate, api, worker, callbacks, beat
    # Every process reaches PostgreSQL through PgBouncer, in transaction pooling mode.
    db = urlparse(secret["ASYNCH_DATABASE_URL"])
    assert db.hostname == "pgbouncer" and db.port == 6432
    assert "pgbouncer" in _by(docs, "Service")
    ini = _by(docs, "ConfigMap")["pgbouncer-config"]["data"]["pgbouncer.ini"]
    assert re.search(r"^pool_mode = transaction$", ini, re.M)


def test_probes_replicas_and_disruption_budgets(docs):
    deps = _by(docs, "Deployment")
    api = deps["asynch-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert resolve_asynch(api["command"]).name == "api"
    assert deps["asynch-beat"]["spec"]["replicas"] == 2, "two beats: one leads, one stands by"
    for name in ("asynch-api", "asynch-worker", "asynch-callbacks", "asynch-beat"):
        assert any("Probe" in k for k in deps[name]["spec"]["template"]["spec"]["containers"][0]), name
    pdbs = _by(docs, "PodDisruptionBudget")
    for name in ("asynch-api", "asynch-worker", "asynch-callbacks", "asynch-beat", "pgbouncer"):
        sel = pdbs[name]["spec"]["selector"]["matchLabels"]
        labels = deps[name]["spec"]["template"]["metadata"]["labels"]
        assert sel.items() <= labels.items(), f"PDB {name} selects no pod of its Deployment"
    job = _by(docs, "Job")["asynch-migrate"]["spec"]["template"]["spec"]["containers"][0]
    assert job["command"] == ["asynch", "db", "upgrade"]


def _mi(q: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi|M|G)", q)
    assert m, q
    n, unit = float(m.group(1)), m.group(2)
    return n * {"Mi": 1, "Gi": 1024, "M": 1 / 1.048576, "G": 1000 / 1.048576}[unit]


def test_resource_requests_cover_the_measured_rss(docs):
    deps = _by(docs, "Deployment")
    for d in list(deps.values()) + list(_by(docs, "Job").values()):
        for c in _containers(d):
            assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"], c["name"]
    for name, kind, opt in (("asynch-api", "api", "--workers"), ("asynch-worker", "worker", "-c"),
                            ("asynch-callbacks", "worker", "-c")):
        c = deps[name]["spec"]["template"]["spec"]["containers"][0]
        processes = int(c["command"][c["command"].index(opt) + 1]) + 1  # + the master / main process
        assert _mi(c["resources"]["requests"]["memory"]) >= processes * RSS_MI[kind], name
        assert _mi(c["resources"]["limits"]["memory"]) > _mi(c["resources"]["requests"]["memory"])


def test_the_callback_pool_leaves_a_process_free_of_any_one_tenant(docs):
    """Issue 32 item 8: a tenant holds at most all but one of a node's
    delivery processes; with one process (or the old 2 against a cap of 4)
    its stalled receivers held them all."""
    from app.config import Settings

    c = _by(docs, "Deployment")["asynch-callbacks"]["spec"]["template"]["spec"]["containers"][0]
    n = int(c["command"][c["command"].index("-c") + 1])
    assert n >= 2 and n > Settings().delivery_tenant_inflight, c["command"]


def test_the_autoscaler_scales_workers_on_metrics_the_project_exports(docs, make_model):
    from app.observe.cluster import render

    so = _by(docs, "ScaledObject")["asynch-worker"]
    assert so["spec"]["scaleTargetRef"]["name"] in _by(docs, "Deployment")
    make_model("echo")
    exported = set(re.findall(r"^# TYPE (\S+) ", render()[0].decode(), re.M))
    queries = [t["metadata"]["query"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
    used = {n for q in queries for n in re.findall(r"\basynch_[a-z_]+\b", q)}
    assert used and used <= exported, f"{used - exported} are not on /metrics/cluster"
    assert {"asynch_jobs", "asynch_oldest_pending_age_seconds"} <= used


def test_the_workerless_cronjobs_validate_and_run_real_commands():
    """deploy/k8s/workerless/: the seed-002 deployment's CronJobs (runWork, cleanWork)."""
    jobs = [d for d in yaml.safe_load_all((K8S / "workerless" / "cronjobs.yaml").read_text()) if d]
    assert {d["metadata"]["name"] for d in jobs} == {"asynch-run-work", "asynch-clean-work"}
    for d in jobs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        (c,) = d["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        resolve_asynch(c["command"])
        assert c["command"][:3] in (["asynch", "work", "run-once"], ["asynch", "work", "clean-once"])
