"""The command line's rough edges (issue 32, item 6), each as a user meets it,
the commands run as real subprocesses against the test database and an API
on a real socket: `./scripts/dev.sh --help` builds nothing; `asynch
--version`; `asynch models list`; every error is one line (no JSON block);
a disabled model says so; an unknown tenant's limits are an error, not the
defaults; an empty key is an error, not a fallback to the dev admin key; a
job that ended without a result says that, not "not finished"; `asynch
worker --name` names the node."""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
from helpers import ROOT, auth, wait_until


def asynch(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=cwd, env=env or dict(os.environ),
                          capture_output=True, text=True, timeout=60)


def _client(api_url: str, key: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCH_API_KEY", "ASYNCH_KEY")}
    env.update(ASYNCH_URL=api_url, PYTHONPATH=str(ROOT))
    if key is not None:
        env["ASYNCH_API_KEY"] = key
    return asynch(*args, env=env)


def test_dev_sh_help_prints_every_option_without_building_anything(tmp_path):
    (tmp_path / "scripts").mkdir()
    for f in ("dev.sh", "venv.sh"):
        shutil.copy2(ROOT / "scripts" / f, tmp_path / "scripts" / f)
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    out = subprocess.run(["bash", "scripts/dev.sh", "--help"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("Usage: ./scripts/dev.sh"), out
    assert not (tmp_path / ".venv").exists()  # no venv, no pip install before the help
    from app.cli.devstack import dev

    options = {o for p in dev.params if isinstance(p, click.Option) for o in p.opts}
    assert options and not {o for o in options if o not in out.stdout}, out.stdout


def test_version_is_the_package_version():
    out = asynch("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"asynch {importlib.metadata.version('model-asynch')}"


def test_models_list_shows_every_model(make_model):
    make_model("alpha", max_concurrency=3, queue_limit=7)
    make_model("beta", enabled=False)
    out = asynch("models", "list")
    assert out.returncode == 0, out.stderr
    listed = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(m["model_name"], m["enabled"], m["max_concurrency"], m["queue_limit"]) for m in listed] == [
        ("alpha", True, 3, 7), ("beta", False, 4, 16)]
    assert set(listed[0]) == {"model_name", "enabled", "base_url", "max_concurrency", "queue_limit"}
    assert listed[0]["base_url"].startswith("http://127.0.0.1:")


def test_every_domain_error_is_one_line(make_model, tmp_path):
    make_model("m")
    out = asynch("tenants", "limits", "acme", "--weight", "0", "--burst", "-1")
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert lines[0].startswith("Error: invalid tenant limits; /weight: must be an integer from 1 to 1000") and \
        "; /burst: " in lines[0], lines
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"model_name": "x", "base_url": "ftp://no"}, {"model_name": "y"}]))
    out = asynch("models", "import", str(bad))
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: ") and "/0/base_url" in lines[0]


def test_an_unknown_tenants_limits_are_an_error_not_the_defaults(make_model, user_key):
    out = asynch("tenants", "limits", "nosuchtenant")
    assert out.returncode == 1 and out.stdout == "" and out.stderr.splitlines() == [
        "Error: tenant not found: nosuchtenant (no API key, no limits)"], out
    known = asynch("tenants", "limits", "tenant-a")  # it has a key (user_key): its defaults
    assert known.returncode == 0 and json.loads(known.stdout)["weight"] is None, known.stderr
    # Limits may be set before the tenant has a key; then it is known.
    assert asynch("tenants", "limits", "newcomer", "--weight", "2").returncode == 0
    assert json.loads(asynch("tenants", "limits", "newcomer").stdout)["weight"] == 2


def test_an_empty_key_is_an_error_not_a_fallback(api_url):
    out = _client(api_url, None, "wait", "job_x", "--key", "")
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "Error: empty key: --key is set but empty; pass a key, or leave it out to use the dev stack's admin key"]
    out = _client(api_url, "", "wait", "job_x")
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "Error: empty key: ASYNCH_API_KEY is set but empty; pass a key, or leave it out to use the dev stack's "
        "admin key"]


def test_result_and_submit_say_what_the_job_and_the_model_are(api_url, client, make_model, user_key):
    make_model("echo")
    make_model("off", enabled=False)
    out = _client(api_url, user_key, "submit", "off", "{}")
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "Error: model disabled: off (HTTP 404): an admin enables it: asynch models enable off"], out.stderr
    # No worker runs here: the job stays pending, then is canceled.
    job = client.post("/v1/models/echo/jobs", json={}, headers=auth(user_key)).get_json()["job_id"]
    out = _client(api_url, user_key, "result", job)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"Error: job not finished (state: pending) (HTTP 409): wait for it: asynch wait {job}"], out.stderr
    assert client.post(f"/v1/models/echo/jobs/{job}/cancel", headers=auth(user_key)).status_code == 200
    out = _client(api_url, user_key, "result", job)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"Error: job ended without a result (state: canceled) (HTTP 409): only a done job has one: "
        f"`asynch wait {job}` shows how it ended"], out.stderr


@pytest.mark.e2e
def test_worker_name_names_the_node(test_env, tmp_path, r):
    log = tmp_path / "worker.log"
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "-c", "1", "-Q", test_env["ASYNCH_QUEUE_NAME"],
                             "--name", "edge@%h"], cwd=ROOT, env={**os.environ, "ASYNCH_WORKER_METRICS_PORT": "0",
                                                                   "ASYNCH_LOG_LEVEL": "INFO"},
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    node = f"edge@{socket.gethostname()}"
    try:
        wait_until(lambda: f"{node} ready." in log.read_text(errors="replace"), timeout=60, what="asynch worker")
        # Its liveness goes by that name (a second node on this host keeps celery@host).
        wait_until(lambda: any(node in k for k in r.scan_iter(match="*worker*")), timeout=30,
                   what="the node's liveness key")
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass
