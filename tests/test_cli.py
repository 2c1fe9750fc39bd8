"""The asynch command line, run as a real subprocess against the test database."""
from __future__ import annotations

import json
import subprocess
import sys

from sqlalchemy import select

from app.db import transaction
from app.models import api_keys
from conftest import ROOT, auth, wait_until


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
    out = asynch("env", env=env)
    assert "ASYNCH_DATABASE_URL=" in out.stdout and "test-pepper" not in out.stdout


def test_help_for_every_command(test_env):
    import os

    env = {**os.environ, **test_env}
    for cmd in ([], ["db"], ["keys"], ["keys", "create"], ["maintenance"], ["api"], ["worker"], ["beat"], ["dev"]):
        out = asynch(*cmd, "--help", env=env)
        assert out.returncode == 0 and "Usage:" in out.stdout, cmd
