"""The asynch command line, run as a real subprocess against the test database."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import ROOT, auth, job_row, wait_until
from sqlalchemy import select

from app.infra.db import transaction
from app.infra.tables import api_keys


def asynch(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_keys_create_list_revoke(test_env, client):
    import os

    env = {**os.environ, **test_env}
    out = asynch("keys", "create", "--tenant", "acme", "--admin", env=env)
    assert out.returncode == 0, out.stderr
    key = out.stdout.strip()
    assert key.startswith("ak_") and "shown once" in out.stderr
    with transaction() as conn:
        row = conn.execute(select(api_keys)).one()
    assert row.role == "admin" and row.tenant_id == "acme" and key not in row.key_hash
    assert client.get("/v1/keys", headers=auth(key)).status_code == 200
    listed = [json.loads(x) for x in asynch("keys", "list", env=env).stdout.splitlines()]
    assert [k["prefix"] for k in listed] == [row.prefix]
    assert asynch("keys", "revoke", str(row.id), env=env).returncode == 0
    # The API process had the key cached; the revocation reaches it over pub/sub.
    wait_until(lambda: client.get("/v1/keys", headers=auth(key)).status_code == 401, timeout=5,
               what="revocation to reach the API process")
    bad = asynch("keys", "create", "--tenant", "no spaces", env=env)
    assert bad.returncode != 0 and "invalid API key request" in bad.stderr


def test_db_upgrade_is_idempotent_and_maintenance_runs(test_env):
    import os

    env = {**os.environ, **test_env}
    assert asynch("db", "upgrade", env=env).returncode == 0
    out = asynch("maintenance", "reconcile", env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["processed"] == 0
    out = asynch("maintenance", "recover", env=env)
    assert out.returncode == 0 and "leases" in json.loads(out.stdout)
    out = asynch("maintenance", "retry", env=env)
    assert out.returncode == 0
    report = json.loads(out.stdout)
    assert report["processed"] == 0 and report["retry"]["gate_full"] == 0 and report["wipe"]["processed"] == 0
    out = asynch("env", env=env)
    assert "ASYNCH_DATABASE_URL=" in out.stdout and "test-pepper" not in out.stdout


def test_help_for_every_command(test_env):
    import os

    import click

    env = {**os.environ, **test_env}
    from app.cli import main

    ctx = click.Context(main, info_name="asynch")

    def walk(group, path):
        yield path, group
        if isinstance(group, click.Group):
            for name in group.list_commands(ctx):
                yield from walk(group.get_command(ctx, name), [*path, name])

    commands = dict((tuple(p), c) for p, c in walk(main, []))
    assert ("jobs", "requeue") in commands and ("models", "import") in commands and ("result",) in commands
    # Every option says what it does (asynch dev and the client commands included).
    bare = [(" ".join(p), o.opts) for p, c in commands.items() for o in c.params
            if isinstance(o, click.Option) and not o.help]
    assert bare == [], bare
    # The real entry point once (and a nested command), then every command
    # in-process: a subprocess per command cost ~1 s of imports each.
    for cmd in ([], ["jobs", "requeue"]):
        out = asynch(*cmd, "--help", env=env)
        assert out.returncode == 0 and "Usage:" in out.stdout, cmd
    from click.testing import CliRunner

    runner = CliRunner()
    for cmd in commands:
        out = runner.invoke(main, [*cmd, "--help"], prog_name="asynch")
        assert out.exit_code == 0 and "Usage:" in out.output, (cmd, out.output)


def test_a_client_command_fails_in_one_line_with_the_next_step(tmp_path):
    """No API at the URL, no key, a bad payload, no job named: one line each,
    exit 1 (2 for usage), no traceback unless --debug; no dev stack is found
    outside a checkout, so the old default URL stays."""
    from helpers import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCH_")}
    env["PYTHONPATH"] = str(ROOT)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)

    url = f"http://127.0.0.1:{free_port()}"
    for args in (["wait", "job_x"], ["result", "demo-echo", "job_x"], ["cancel", "job_x"], ["submit", "m", "{}"]):
        out = run(*args, "--url", url, "--key", "ak_x")
        assert out.returncode == 1 and out.stdout == "", out
        assert out.stderr.splitlines() == [f"Error: cannot reach the API at {url} (connection refused): is it "
                                           "running? start one with ./scripts/dev.sh, or pass --url / set "
                                           "ASYNCH_URL"], out.stderr
    debug = run("wait", "job_x", "--url", url, "--key", "ak_x", "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ConnectionError" in debug.stderr
    out = run("wait", "job_x")
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "Error: no API key for http://127.0.0.1:8000: pass --key or set ASYNCH_API_KEY (or run ./scripts/dev.sh "
        "in this checkout: its admin key is used)"], out.stderr
    out = run("submit", "m", "{nope", "--key", "k", "--url", url)
    assert out.returncode == 2 and "Invalid value for PAYLOAD: not JSON" in out.stderr and "Traceback" not in out.stderr
    out = run("submit", "m", "@missing.json", "--key", "k", "--url", url)
    assert out.returncode == 2 and "cannot read missing.json" in out.stderr and "Traceback" not in out.stderr
    out = run("wait", "a", "b", "c", "--key", "k")
    assert out.returncode == 2 and "name a job: JOB_ID (or MODEL JOB_ID)" in out.stderr


def _env(test_env) -> dict:
    import os

    return {**os.environ, **test_env}


def test_models_export_import_enable_disable(test_env, make_model, client, user_key, tmp_path):
    env = _env(test_env)
    make_model("echo", head_msg="API_KEY:s3cret", queue_limit=5,
               form=[{"field": "prompt", "type": "string", "required": True}])
    out = asynch("models", "export", env=env)
    assert out.returncode == 0, out.stderr
    exported = json.loads(out.stdout)
    assert [m["model_name"] for m in exported] == ["echo"] and "head_msg" not in exported[0]
    assert "s3cret" not in out.stdout
    full = tmp_path / "models.json"
    assert asynch("models", "export", "--with-secrets", "-o", str(full), "echo", env=env).returncode == 0
    data = json.loads(full.read_text())
    assert data[0]["head_msg"] == "API_KEY:s3cret"

    data[0]["queue_limit"] = 9
    data.append({**data[0], "model_name": "echo2", "remark": "copy"})
    full.write_text(json.dumps(data))
    out = asynch("models", "import", str(full), env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"created": ["echo2"], "updated": ["echo"]}
    models = {m["model_name"]: m for m in client.get("/v1/models", headers=auth(user_key)).get_json()["models"]}
    assert models["echo"]["queue_limit"] == 9 and models["echo2"]["remark"] == "copy"

    # All or nothing: one bad entry (and a redacted head_msg) changes nothing.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"models": [{"model_name": "echo", "queue_limit": 1},
                                          {"model_name": "x", "base_url": "ftp://no"},
                                          {"model_name": "y", "base_url": "http://h", "head_msg": "K:***"}]}))
    out = asynch("models", "import", str(bad), env=env)
    assert out.returncode != 0 and "/1/base_url" in out.stderr and "/2/head_msg" in out.stderr
    models = {m["model_name"]: m for m in client.get("/v1/models", headers=auth(user_key)).get_json()["models"]}
    assert models["echo"]["queue_limit"] == 9 and set(models) == {"echo", "echo2"}

    out = asynch("models", "disable", "echo", env=env)
    assert out.returncode == 0 and json.loads(out.stdout) == {"model_name": "echo", "enabled": False}
    assert client.post("/v1/models/echo/jobs", json={"prompt": "x"}, headers=auth(user_key)).status_code == 404
    assert asynch("models", "enable", "echo", env=env).returncode == 0
    assert client.post("/v1/models/echo/jobs", json={"prompt": "x"}, headers=auth(user_key)).status_code == 202
    out = asynch("models", "enable", "ghost", env=env)
    assert out.returncode != 0 and "model not found: ghost" in out.stderr


def _broker_messages(test_env, queue: str) -> int | None:
    import redis

    url = test_env["ASYNCH_BROKER_URL"]
    if not url.startswith("redis"):
        return None
    r = redis.Redis.from_url(url)
    return sum(r.llen(k) for k in r.scan_iter(match=queue + "*") if r.type(k) == b"list")


def test_jobs_show_list_cancel_requeue(test_env, make_model, user_key, r):
    from datetime import timedelta

    from app import transitions
    from app.clock import now
    from app.jobs import admission
    from app.jobs import service as svc
    from app.states import JobState
    from app.tenancy.keys import Principal

    env = _env(test_env)
    make_model("echo", retry_times=2)
    p = Principal("tenant-a", "user", None)
    ids = [svc.submit(p, "echo", {"i": i}).row.id for i in range(3)]
    pending, waiting, running = ids

    out = asynch("jobs", "show", pending, env=env)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["job_id"] == pending and shown["state"] == "pending" and shown["tenant"] == "tenant-a"
    assert shown["payload"] == {"i": 0} and shown["timeline"][0]["event"] == "created"
    bad = asynch("jobs", "show", "job_nope", env=env)
    assert bad.returncode != 0 and "job not found: job_nope" in bad.stderr

    listed = [json.loads(x) for x in asynch("jobs", "list", "--model", "echo", "--state", "pending",
                                            env=env).stdout.splitlines()]
    assert sorted(j["job_id"] for j in listed) == sorted(ids)
    assert asynch("jobs", "list", "--since", "2999-01-01", env=env).stdout == ""
    assert asynch("jobs", "list", "--state", "weird", env=env).returncode != 0

    # A pending job: its run message is sent again (the claim CAS drops duplicates).
    # The submits' own messages leave this process's outbox first (its sender
    # thread publishes them after the 202; a loaded machine lets it lag).
    from app.jobs import handoff
    assert handoff.flush(10)
    before = _broker_messages(test_env, test_env["ASYNCH_QUEUE_NAME"])
    out = asynch("jobs", "requeue", pending, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["action"] == "republished"
    if before is not None:
        assert _broker_messages(test_env, test_env["ASYNCH_QUEUE_NAME"]) == before + 1

    # A retry_wait job with a long backoff: re-admitted through the gate now.
    with transaction() as conn:
        transitions.claim(conn, waiting, 0, now() + timedelta(minutes=5))
        transitions.fail_attempt(conn, waiting, 1, "boom", retry_at=now() + timedelta(hours=1))
        transitions.claim(conn, running, 0, now() + timedelta(minutes=5))
    admission.release_slot("echo", "acme", waiting)
    out = asynch("jobs", "requeue", waiting, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["action"] == "readmitted"
    # (Read from its row: `jobs show` and its internal_state were checked above;
    # a CLI process per read costs ~1.5 CPU-s of imports.)
    assert JobState(job_row(waiting).state).label == "pending"
    assert r.zscore("asynch:gate:{echo}", waiting) is not None

    out = asynch("jobs", "requeue", running, env=env)
    assert out.returncode != 0 and "running" in out.stderr

    out = asynch("jobs", "cancel", pending, env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "canceled"
    again = asynch("jobs", "cancel", pending, env=env)
    assert again.returncode != 0 and "already finished" in again.stderr
    # Terminal states are absorbing: requeue refuses and changes nothing.
    out = asynch("jobs", "requeue", pending, env=env)
    assert out.returncode != 0 and "terminal" in out.stderr
    assert JobState(job_row(pending).state).label == "canceled"


def _spawn(args: list[str], env: dict, log, cwd=ROOT) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args], cwd=cwd, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass


def _healthy(url: str) -> bool:
    import requests

    try:
        return requests.get(url + "/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.slow
def test_api_worker_and_beat_commands_run(test_env, tmp_path):
    from helpers import free_port, wait_until

    env = _env(test_env)
    port = free_port()
    logs = {n: tmp_path / f"{n}.log" for n in ("api", "worker", "beat")}
    procs = [
        _spawn(["api", "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "2"], env, open(logs["api"], "w")),
        _spawn(["worker", "-c", "1", "-Q", test_env["ASYNCH_QUEUE_NAME"]], env, open(logs["worker"], "w")),
        _spawn(["beat"], env, open(logs["beat"], "w"), cwd=tmp_path),
    ]
    try:
        wait_until(lambda: _healthy(f"http://127.0.0.1:{port}"), timeout=30, what="asynch api")
        wait_until(lambda: "ready." in logs["worker"].read_text(errors="replace"), timeout=60, what="asynch worker")
        wait_until(lambda: "beat: Starting" in logs["beat"].read_text(errors="replace"), timeout=30,
                   what="asynch beat")
    finally:
        for p in procs:
            _stop(p)


@pytest.mark.slow
@pytest.mark.e2e
def test_dev_command_runs_a_job_end_to_end(test_env, tmp_path):
    import re

    import requests
    from helpers import free_port, wait_until

    env = _env(test_env)
    port, model_port = free_port(), free_port()
    log = tmp_path / "dev.log"
    # Its own PostgreSQL and Valkey in a data directory of its own (not this checkout's .asynch/).
    data = Path(tempfile.mkdtemp(prefix="asynch-cli-dev-"))
    proc = _spawn(["dev", "--port", str(port), "--model-port", str(model_port), "--data-dir", str(data)], env,
                  open(log, "w"))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: "Admin key" in log.read_text(errors="replace") and _healthy(base), timeout=60,
                   what="asynch dev")
        key = re.search(r"Admin key \(tenant \"demo\"\): (\S+)", log.read_text()).group(1)
        job = requests.post(f"{base}/v1/models/demo-echo/jobs", json={"prompt": "hello"},
                            headers=auth(key), timeout=10).json()
        done = requests.get(f"{base}{job['poll_url']}/wait?timeout=30000", headers=auth(key), timeout=40).json()
        assert done["state"] == "done", done
        res = requests.get(f"{base}{job['result_url']}", headers=auth(key), timeout=10).json()
        assert res["echo"] == {"prompt": "hello"}
    finally:
        _stop(proc)
        shutil.rmtree(data, ignore_errors=True)


def test_a_command_outside_a_checkout_says_no_database_is_configured_and_creates_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCH_")}
    env["PYTHONPATH"] = str(ROOT)
    for args in (["keys", "list"], ["db", "upgrade"]):
        out = subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 1, out
        assert out.stdout == "" and out.stderr.strip().splitlines() == [
            "Error: no database configured: set ASYNCH_DATABASE_URL (postgresql+psycopg2://...), or run "
            "`asynch dev` and use asynch inside its checkout"], out.stderr
    assert list(tmp_path.iterdir()) == []  # no stray database file, nothing at all


def test_tenant_limits_set_and_show(test_env, make_model, r):
    make_model("m")
    env = {**os.environ, **test_env}
    out = asynch("tenants", "limits", "acme", "--weight", "3", "--rate", "5", "--queue-limit", "m=2", env=env)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert (shown["weight"], shown["rate_per_second"], shown["queue_limits"]) == (3, 5.0, {"m": 2})
    assert r.hget("asynch:tenant:weights", "acme") == "3"  # the dispatcher reads it from Redis
    again = json.loads(asynch("tenants", "limits", "acme", "--queue-limit", "m=", env=env).stdout)
    assert again["queue_limits"] == {} and again["weight"] == 3
    bad = asynch("tenants", "limits", "acme", "--weight", "0", env=env)
    assert bad.returncode != 0 and "/weight" in bad.stderr
