"""Issue 12, items 2, 7 and 8: secrets at rest, insecure defaults, overview and metrics.

- head_msg values are stored encrypted (MultiFernet, ASYNCH_SECRETS_KEYS),
  still reach the model, and plaintext rows from before still read;
- `asynch secrets rotate` re-encrypts everything with the first key, after
  which the old key can go;
- a job's modelKey is cleared at its terminal state;
- outside dev mode a weak bootstrap key or an empty pepper stops a server.
"""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers import job_row, P
from sqlalchemy import event, select

from app.catalog import registry
from app.cli import main as cli_main
from app.config import set_settings
from app.infra import secretbox
from app.infra.db import get_engine, transaction
from app.infra.tables import models, tasks, tenant_secrets
from app.jobs import execution
from app.jobs import service as jobs
from app.maintenance.secret_rotation import rotate_secrets
from app.secret_settings import check_startup
from app.states import JobState

K1, K2 = secretbox.new_key(), secretbox.new_key()
HEAD = "API_KEY:model-s3cret,API_STATE:on"


def _stored_head(name: str = "m") -> str:
    with transaction() as conn:
        return conn.execute(select(models.c.head_msg).where(models.c.model_name == name)).scalar_one()


def test_head_msg_is_encrypted_at_rest_and_still_reaches_the_model(settings, make_model, model_server):
    make_model("m", head_msg=HEAD, model_key_headers="X-Api-Key")
    stored = _stored_head()
    assert stored.startswith("enc1:") and "model-s3cret" not in stored
    assert secretbox.decrypt(stored) == HEAD
    job_id = jobs.submit(P, "m", {"q": 1}, jobs.SubmitOptions(model_key="X-Api-Key:per-job")).row.id
    assert execution.run_attempt(job_id, 0) == "done"
    (call,) = model_server.state.calls
    h = {k.lower(): v for k, v in call["headers"].items()}
    assert (h["api_key"], h["api_state"], h["x-api-key"]) == ("model-s3cret", "on", "per-job")
    # The job's modelKey does not stay at rest once the job is terminal.
    assert job_row(job_id).model_key is None and job_row(job_id).passthrough_headers is None


def test_a_plaintext_head_msg_from_before_still_reads_and_rotate_encrypts_it(settings, make_model, model_server):
    make_model("m")
    with transaction() as conn:
        conn.execute(models.update().where(models.c.model_name == "m").values(head_msg=HEAD))
    registry._cache.pop("m")
    job_id = jobs.submit(P, "m", {"q": 1}).row.id
    assert execution.run_attempt(job_id, 0) == "done"
    assert {k.lower(): v for k, v in model_server.state.calls[0]["headers"].items()}["api_key"] == "model-s3cret"
    assert rotate_secrets()["models"] == 1
    assert _stored_head().startswith("enc1:") and secretbox.decrypt(_stored_head()) == HEAD


def test_key_rotation_with_the_cli(settings, make_model, client, user_key):
    set_settings(settings.with_overrides(secrets_keys=K1))
    make_model("m", head_msg=HEAD, model_key_headers="X-Api-Key")
    secret = client.get("/v1/tenants/tenant-a/callback-secret", headers={"Authorization": f"Bearer {user_key}"}) \
        .get_json()["secret"]
    # A new key first, the old one kept: everything still reads; rotate moves it all to K2.
    set_settings(settings.with_overrides(secrets_keys=f"{K2},{K1}"))
    assert secretbox.decrypt(_stored_head()) == HEAD
    out = CliRunner().invoke(cli_main, ["secrets", "rotate"])
    assert out.exit_code == 0, out.output
    assert '"models": 1' in out.output and '"callback_secrets": 1' in out.output
    # The old key can go now.
    set_settings(settings.with_overrides(secrets_keys=K2))
    assert secretbox.decrypt(_stored_head()) == HEAD
    got = client.get("/v1/tenants/tenant-a/callback-secret", headers={"Authorization": f"Bearer {user_key}"})
    assert got.get_json()["secret"] == secret
    # Without the key that encrypted them the values do not read (never ciphertext as the secret).
    set_settings(settings.with_overrides(secrets_keys=K1))
    with pytest.raises(secretbox.SecretsKeyMissing):
        secretbox.decrypt(_stored_head())
    with transaction() as conn:
        stored = conn.execute(select(tenant_secrets.c.secret)).scalar_one()
    with pytest.raises(secretbox.SecretsKeyMissing):
        secretbox.decrypt_bytes(stored)


def test_a_new_key_prints_a_valid_fernet_key():
    out = CliRunner().invoke(cli_main, ["secrets", "new-key"])
    assert out.exit_code == 0 and secretbox._box(out.output.strip(), "")


# What a deployment sets (the suite itself runs in dev mode, tests/conftest.py).
DEPLOYED = {"dev_mode": False, "secrets_keys": K1, "metrics_token": "mZ4xC9vB2nM7aS1dF6gH3jK8lQ5wE0rT"}


@pytest.mark.parametrize("change, refused", [
    ({"bootstrap_admin_key": "change-me"}, "ASYNCH_BOOTSTRAP_ADMIN_KEY"),
    ({"key_pepper": ""}, "ASYNCH_KEY_PEPPER"),
    ({"bootstrap_admin_key": "bV3nM8qW2eR7tY1uI6oP4aS9dF5gH0jK"}, None),
    ({"bootstrap_admin_key": "", "key_pepper": "p"}, None),  # no bootstrap key at all is fine
    ({"bootstrap_admin_key": "change-me", "key_pepper": "", "dev_mode": True}, None),
])
def test_outside_dev_mode_weak_secrets_refuse_to_start(settings, change, refused):
    s = settings.with_overrides(**{**DEPLOYED, **change})
    if refused is None:
        check_startup(s)
        return
    with pytest.raises(ValueError, match=refused):
        check_startup(s)
    # The server commands refuse before they exec anything.
    set_settings(s)
    for cmd in (["api"], ["worker"], ["callback-worker"], ["beat"]):
        out = CliRunner().invoke(cli_main, cmd)
        assert out.exit_code != 0 and refused in out.output, (cmd, out.output)


# --- item 7: the overview is the caller's; a scrape does not count the history ------------

def _rows(model: str, tenant: str, state, n: int) -> None:
    """n rows in ``state``, with the Redis state admission and dispatch leave them: a pending or running job
    holds its gate slots (the model's and the tenant's), a running one its tenant's permit too."""
    import time

    from app.clock import now
    from app.infra.redis import keys
    from app.infra.redis.client import get_redis
    t = now()
    ids = [jobs.new_job_id() for _ in range(n)]
    with transaction() as conn:
        conn.execute(tasks.insert(), [dict(
            id=job_id, tenant_id=tenant, creator="", model_name=model, biz_name="", callback_url=None,
            model_key=None, request_payload="{}", request_hash="h", passthrough_headers=None, idempotency_key=None,
            state=int(state), attempt=0, retry_count=0, created_at=t, enqueue_at=t, updated_at=t, deadline_at=t)
            for job_id in ids])
    if state in (JobState.PENDING, JobState.RUNNING):
        r = get_redis()
        r.zadd(keys.gate(model), dict.fromkeys(ids, time.time()))
        r.zadd(keys.tenant_gate(model, tenant), dict.fromkeys(ids, time.time()))
        r.sadd(keys.gate_tenants(model), tenant)
    if state == JobState.RUNNING:
        get_redis().zadd(keys.semaphore(model, tenant), dict.fromkeys(ids, time.time() + 60))


def test_a_user_overview_shows_only_its_own_tenants_jobs(make_model, client, user_key, admin_key):
    make_model("m")
    _rows("m", "tenant-a", JobState.PENDING, 2)
    _rows("m", "tenant-b", JobState.PENDING, 5)
    _rows("m", "tenant-b", JobState.RUNNING, 3)

    def seen(key):
        (m,) = client.get("/v1/overview", headers={"Authorization": f"Bearer {key}"}).get_json()["models"]
        return m["pending"], m["running"], m["queue_depth"]

    assert seen(user_key) == (2, 0, 2)          # tenant-a's own
    assert seen(admin_key)[:2] == (7, 3)        # admins: every tenant


def test_a_scrape_counts_terminal_states_up_to_the_cap(settings, make_model, client):
    set_settings(settings.with_overrides(metrics_job_count_cap=10))
    make_model("m")
    _rows("m", "tenant-a", JobState.DONE, 25)
    _rows("m", "tenant-a", JobState.PENDING, 12)
    statements = []
    engine = get_engine()

    def spy(conn, cursor, statement, params, context, executemany):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", spy)
    try:
        body = client.get("/metrics/cluster").get_data(as_text=True)
    finally:
        event.remove(engine, "before_cursor_execute", spy)
    assert 'asynch_jobs{model="m",state="done"} 10.0' in body      # capped
    assert 'asynch_jobs{model="m",state="pending"} 12.0' in body   # active: exact (the gate's)
    # No GROUP BY over the task table: the active counts are the gates' (tests/test_observe_reads.py).
    assert statements and not [s for s in statements if "asynch_task" in s and "GROUP BY" in s.upper()]


def test_compose_sets_a_metrics_token():
    import yaml

    from helpers import ROOT
    env = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-asynch-env"]
    assert str(env.get("ASYNCH_METRICS_TOKEN", "")).startswith("${ASYNCH_METRICS_TOKEN:?")


# --- item 10: a revoked key is never re-cached ----------------------------------------------

def test_a_key_revoked_during_a_lookup_is_not_cached_again(settings):
    """A lookup that read the key just before the revocation committed must
    not put it back in the cache for ASYNCH_AUTH_CACHE_SECONDS: the read is
    paused right after its SELECT ran, the key is revoked (commit, then the
    invalidation), then the read finishes."""
    import threading

    from app.errors import Unauthorized
    from app.tenancy import keys as key_svc

    set_settings(settings.with_overrides(auth_cache_seconds=60.0))
    key, row = key_svc.create_key("tenant-a", "user", "victim")
    read, go = threading.Event(), threading.Event()
    me = threading.get_ident

    def pause(conn, cursor, statement, params, context, executemany):
        if "asynch_api_keys" in statement and statement.lstrip().upper().startswith("SELECT") \
                and threading.get_ident() == looker[0]:
            read.set()
            go.wait(10)

    looker = [None]
    got = []

    def look():
        looker[0] = me()
        got.append(key_svc.authenticate(key))

    engine = get_engine()
    event.listen(engine, "after_cursor_execute", pause)
    try:
        t = threading.Thread(target=look)
        t.start()
        assert read.wait(10)
        key_svc.revoke_key(row.id)
        go.set()
        t.join(10)
    finally:
        event.remove(engine, "after_cursor_execute", pause)
    assert got and got[0].tenant_id == "tenant-a"  # the racing read saw the key valid ...
    with pytest.raises(Unauthorized):              # ... and did not cache it
        key_svc.authenticate(key)


def test_stats_are_paginated_with_a_cursor(client, admin_key):
    from datetime import date

    from app.infra.tables import model_stats
    with transaction() as conn:
        conn.execute(model_stats.insert(), [dict(day=date(2026, 1, d), tenant_id="tenant-a", creator="",
                                                 model_name="m", request_count=d) for d in range(1, 6)])
    h = {"Authorization": f"Bearer {admin_key}"}
    seen, cursor, pages = [], None, 0
    while True:
        url = "/v1/stats?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(url, headers=h).get_json()
        assert len(page["rows"]) <= 2 and page["total"] == 15  # total: every page's filter, not the page
        seen += [r["request_count"] for r in page["rows"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [1, 2, 3, 4, 5] and pages == 3
    for bad in ("nope", "WyJ4Il0", "limit"):
        r = client.get(f"/v1/stats?cursor={bad}", headers=h)
        assert r.status_code == 422 and r.get_json()["errors"][0]["pointer"] == "/cursor"
    assert client.get("/v1/stats?limit=0", headers=h).status_code == 422


def test_a_forged_cursor_with_a_nul_is_a_422_not_a_500(client, admin_key):
    import base64
    import json
    bad = base64.urlsafe_b64encode(json.dumps(["2026-01-01", "m\u0000", "t", ""]).encode()).decode()
    r = client.get(f"/v1/stats?cursor={bad}", headers={"Authorization": f"Bearer {admin_key}"})
    assert r.status_code == 422
    r = client.get(f"/stat/getModelStat?cursor={bad}", headers={"Authorization": f"Bearer {admin_key}"})
    assert r.status_code == 422
