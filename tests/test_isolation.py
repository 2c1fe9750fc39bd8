"""Tenant isolation and admin-only routes, enumerated from the app's url_map.

Every (method, rule) of the app is classified here: it takes a tenant-owned
thing (a job, its result or callback, an idempotency key, a tenant's stats or
secret) and is in TENANT_SCOPED; or it is ADMIN_ONLY; or it touches nothing
tenant-owned (GLOBAL, with the reason); or it needs no key (PUBLIC).  A
route added without a classification fails
test_every_route_is_classified, so a new route with an id is not forgotten.

Each TENANT_SCOPED case is called with tenant B's key on tenant A's things:
the answer is the not-found form (404, the seed envelope's 404, or a list
without A's rows; 403 for another tenant's stats and secret), it is the
same answer an id that never existed gets, and NOTHING changed: every row
of every table, A's gate slots and the semaphores.  The same request with A's
own key then succeeds, so the case does reach the thing it names.

Each ADMIN_ONLY route answers a user key 403 and changes nothing; an admin
key gets past the check.  The list must equal the operations the OpenAPI
document marks x-admin-only.
"""
from __future__ import annotations

import pytest
from helpers import auth, make_key
from sqlalchemy import select, update
from test_openapi import _openapi_paths

A, B = "tenant-a", "tenant-b"
MODEL = "echo"
NEVER = "job_000000000000000000000000"  # an id no job has

# --- the classification ------------------------------------------------------------------

# (method, rule) -> the requests B makes: (method, url, json, headers) with {pending}, {done}, {model}
# filled from the world; "expect" says what B must get.
TENANT_SCOPED: dict[tuple[str, str], list[dict]] = {
    ("GET", "/v1/models/<model>/jobs/<job_id>"): [
        {"url": "/v1/models/{model}/jobs/{pending}", "expect": 404, "owner": 200},
        {"url": "/v1/models/{model}/jobs/{done}", "expect": 404, "owner": 200}],
    ("GET", "/v1/models/<model>/jobs/<job_id>/wait"): [
        {"url": "/v1/models/{model}/jobs/{done}/wait?timeout=50", "expect": 404, "owner": 200}],
    ("GET", "/v1/models/<model>/jobs/<job_id>/result"): [
        {"url": "/v1/models/{model}/jobs/{done}/result", "expect": 404, "owner": 200}],
    ("POST", "/v1/models/<model>/jobs/<job_id>/cancel"): [
        {"method": "POST", "url": "/v1/models/{model}/jobs/{pending}/cancel", "expect": 404, "owner": 200}],
    ("GET", "/v1/jobs/<job_id>"): [
        {"url": "/v1/jobs/{pending}", "expect": 404, "owner": 200},
        {"url": "/v1/jobs/{done}", "expect": 404, "owner": 200}],
    ("GET", "/v1/models/<model>/jobs/<job_id>/events"): [
        {"url": "/v1/models/{model}/jobs/{done}/events", "expect": 404, "owner": 200}],
    ("GET", "/v1/models/<model>/jobs/<job_id>/stream"): [
        {"url": "/v1/models/{model}/jobs/{done}/stream", "expect": 404, "owner": 200}],
    # B's stream replayed from the epoch (Last-Event-ID "1."), asking for A: only B's own jobs.
    ("GET", "/v1/events"): [
        {"url": "/v1/events?tenant=tenant-a", "headers": {"Last-Event-ID": "1."}, "expect": "no events of A",
         "owner": "events of mine"}],
    # A's idempotency key is A's, per item too.
    ("POST", "/v1/models/<model>/jobs:batch"): [
        {"method": "POST", "url": "/v1/models/{model}/jobs:batch",
         "json": {"jobs": [{"payload": {"prompt": "p"}, "idempotency_key": "idem-a"}]},
         "expect": "new batch job", "owner": "batch replay"}],
    ("GET", "/v1/jobs/<job_id>/callback"): [
        {"url": "/v1/jobs/{done}/callback", "expect": 404, "owner": 200}],
    ("GET", "/v1/jobs"): [
        {"url": "/v1/jobs?tenant=tenant-a", "expect": "empty", "owner": "mine"},
        {"url": "/v1/jobs?cursor={done}", "expect": 422, "owner": 200}],
    ("GET", "/v1/models/<model>/jobs"): [
        {"url": "/v1/models/{model}/jobs?tenant=tenant-a", "expect": "empty", "owner": "mine"},
        {"url": "/v1/models/{model}/jobs?cursor={done}", "expect": 422, "owner": 200}],
    # A's idempotency key is A's: B's submission with it is a new job of B's, never A's replayed.
    ("POST", "/v1/models/<model>/jobs"): [
        {"method": "POST", "url": "/v1/models/{model}/jobs", "json": {"prompt": "p"},
         "headers": {"Idempotency-Key": "idem-a"}, "expect": "new job", "owner": "replay"}],
    ("POST", "/task/createTask"): [
        {"method": "POST", "url": "/task/createTask", "json": {"modelName": "{model}", "requestPayload": {"prompt": "p"}},
         "headers": {"Idempotency-Key": "idem-a"}, "expect": "new job", "owner": "replay"}],
    # getTaskBatch with A's ids: not found, and A's done task is NOT claimed.
    ("POST", "/task/getTaskBatch"): [
        {"method": "POST", "url": "/task/getTaskBatch", "json": {"taskIds": ["{pending}", "{done}"]},
         "expect": "batch not found", "owner": "batch claimed"}],
    ("GET", "/task/getTaskResult"): [
        {"url": "/task/getTaskResult?taskId={done}", "expect": 404, "owner": 200}],
    ("GET", "/v1/stats"): [{"url": "/v1/stats?tenant=tenant-a", "expect": 403, "owner": 200}],
    ("GET", "/stat/getModelStat"): [{"url": "/stat/getModelStat?tenant=tenant-a", "expect": 403, "owner": 200}],
    ("GET", "/v1/tenants/<tenant>/callback-secret"): [
        {"url": "/v1/tenants/tenant-a/callback-secret", "expect": 403, "owner": 200}],
    ("GET", "/v1/tenants/<tenant>/limits"): [
        {"url": "/v1/tenants/tenant-a/limits", "expect": 403, "owner": 200}],
    # Webhooks: A's subscriptions (with their secrets), A's deliveries, A's replays.
    ("GET", "/v1/jobs/<job_id>/webhooks"): [
        {"url": "/v1/jobs/{done}/webhooks", "expect": 404, "owner": 200}],
    ("GET", "/v1/jobs/<job_id>/deliveries"): [
        {"url": "/v1/jobs/{done}/deliveries", "expect": 404, "owner": 200}],
    ("GET", "/v1/tenants/<tenant>/webhooks"): [
        {"url": "/v1/tenants/tenant-a/webhooks", "expect": 403, "owner": 200}],
    ("POST", "/v1/tenants/<tenant>/webhooks"): [
        {"method": "POST", "url": "/v1/tenants/tenant-a/webhooks", "json": {"url": "http://93.184.216.34/b"},
         "expect": 403, "owner": 201}],
    ("DELETE", "/v1/tenants/<tenant>/webhooks/<int:webhook_id>"): [
        {"method": "DELETE", "url": "/v1/tenants/tenant-a/webhooks/{a_webhook}", "expect": 403, "owner": 204}],
    ("POST", "/v1/webhook-deliveries/<int:delivery_id>/replay"): [
        {"method": "POST", "url": "/v1/webhook-deliveries/{a_delivery}/replay", "expect": 404, "owner": 200}],
    ("GET", "/v1/tenants/<tenant>/state"): [
        {"url": "/v1/tenants/tenant-a/state", "expect": 403, "owner": 200}],
    # The tenants a key may look at: a user key, its own only.
    ("GET", "/v1/tenants"): [{"url": "/v1/tenants", "expect": "own tenant only", "owner": "own tenant only"}],
    # Files (OpenAI's Files API): A's file, its content, its deletion; B's list holds none of A's.
    ("GET", "/v1/files/<file_id>"): [{"url": "/v1/files/{a_file}", "expect": 404, "owner": 200}],
    ("GET", "/v1/files/<file_id>/content"): [{"url": "/v1/files/{a_file}/content", "expect": 404, "owner": 200}],
    ("DELETE", "/v1/files/<file_id>"): [
        {"method": "DELETE", "url": "/v1/files/{a_file}", "expect": 404, "owner": 200}],
    ("GET", "/v1/files"): [{"url": "/v1/files", "expect": "no data", "owner": "my data"}],
    # Batches: A's batch, its cancel; a batch over A's input file; B's list holds none of A's.
    ("GET", "/v1/batches/<batch_id>"): [{"url": "/v1/batches/{a_batch}", "expect": 404, "owner": 200}],
    ("POST", "/v1/batches/<batch_id>/cancel"): [
        {"method": "POST", "url": "/v1/batches/{a_batch}/cancel", "expect": 404, "owner": 200}],
    ("POST", "/v1/batches"): [
        {"method": "POST", "url": "/v1/batches", "expect": 404, "owner": 200,
         "json": {"input_file_id": "{a_file}", "endpoint": "/v1/chat/completions", "completion_window": "24h"}}],
    ("GET", "/v1/batches"): [{"url": "/v1/batches", "expect": "no data", "owner": "my batch"}],
    # Seed 000's own routes (ASYNCH_SEED000_MODEL: the model they serve, set for these cases).
    ("GET", "/jobs/<job_id>"): [
        {"url": "/jobs/{pending}", "expect": 404, "owner": 200, "seed000": True},
        {"url": "/jobs/{done}", "expect": 404, "owner": 200, "seed000": True}],
    ("GET", "/jobs/<job_id>/wait"): [
        {"url": "/jobs/{done}/wait?timeout=50", "expect": 404, "owner": 200, "seed000": True}],
    ("GET", "/jobs/<job_id>/result"): [
        {"url": "/jobs/{done}/result", "expect": 404, "owner": 200, "seed000": True}],
    ("POST", "/jobs"): [
        {"method": "POST", "url": "/jobs", "json": {"prompt": "p"}, "headers": {"Idempotency-Key": "idem-a"},
         "expect": "new job", "owner": "replay", "seed000": True}],
}

_ANY = "/v1/maintenance/<any(retry, recover, cleanup, reconcile):name>"
# (method, rule) -> requests an admin could make successfully; a user key must get 403.
ADMIN_ONLY: dict[tuple[str, str], list[tuple[str, dict | None]]] = {
    ("POST", "/v1/models"): [("/v1/models", {"model_name": "new", "base_url": "http://127.0.0.1:1"})],
    ("PUT", "/v1/models/<name>"): [("/v1/models/{model}", {"remark": "x"})],
    ("PATCH", "/v1/models/<name>"): [("/v1/models/{model}", {"enabled": False})],
    ("DELETE", "/v1/models/<name>"): [("/v1/models/idle", None)],
    ("POST", "/model/createModel"): [("/model/createModel", {"modelName": "new", "baseUrl": "http://127.0.0.1:1"})],
    ("POST", "/model/updateModel"): [("/model/updateModel", {"modelName": "{model}", "remark": "x"})],
    ("POST", "/model/deleteModel"): [("/model/deleteModel", {"modelName": "idle"})],
    ("POST", "/v1/model-types"): [("/v1/model-types", {"type_name": "new"})],
    ("PUT", "/v1/model-types/<int:type_id>"): [("/v1/model-types/1", {"remark": "x"})],
    ("PATCH", "/v1/model-types/<int:type_id>"): [("/v1/model-types/1", {"remark": "x"})],
    ("DELETE", "/v1/model-types/<int:type_id>"): [("/v1/model-types/1", None)],
    ("POST", "/modelType/create"): [("/modelType/create", {"typeName": "new"})],
    ("POST", "/modelType/update"): [("/modelType/update", {"typeId": 1, "remark": "x"})],
    ("POST", "/modelType/delete"): [("/modelType/delete", {"typeId": 1})],
    ("POST", "/v1/keys"): [("/v1/keys", {"tenant": B, "role": "admin"})],
    ("GET", "/v1/keys"): [("/v1/keys", None)],
    ("DELETE", "/v1/keys/<int:key_id>"): [("/v1/keys/{a_key_id}", None)],
    ("POST", _ANY): [(f"/v1/maintenance/{n}", None) for n in ("retry", "recover", "cleanup", "reconcile")],
    ("POST", "/v1/maintenance/autotune"): [("/v1/maintenance/autotune", {"dry_run": False})],
    ("GET", "/v1/maintenance/runs"): [("/v1/maintenance/runs", None)],
    ("GET", "/v1/maintenance/state"): [("/v1/maintenance/state", None)],
    ("GET", "/v1/workers"): [("/v1/workers", None)],
    ("POST", "/v1/models/<model>/jobs/<job_id>/fail"): [("/v1/models/{model}/jobs/{pending}/fail", None)],
    ("POST", "/task/runWork"): [("/task/runWork", None)],
    ("POST", "/task/cleanWork"): [("/task/cleanWork", None)],
    ("POST", "/model/autoTune"): [("/model/autoTune", {"dryRun": False})],
    ("POST", "/v1/tenants/<tenant>/callback-secret/rotate"): [("/v1/tenants/tenant-a/callback-secret/rotate", None)],
    ("PUT", "/v1/tenants/<tenant>/limits"): [("/v1/tenants/tenant-a/limits", {"weight": 5})],
    ("PATCH", "/v1/tenants/<tenant>/limits"): [("/v1/tenants/tenant-a/limits", {"weight": 5})],
}

# Any key; nothing tenant-owned is named, and what is shown is shown to every tenant.
GLOBAL: dict[tuple[str, str], str] = {
    ("GET", "/v1/models"): "models are global configuration (users: enabled ones)",
    ("GET", "/v1/models/<name>"): "models are global configuration",
    ("GET", "/model/getModel"): "models are global configuration",
    ("GET", "/model/listModel"): "models are global configuration",
    ("GET", "/v1/model-types"): "model types are global configuration",
    ("GET", "/modelType/list"): "model types are global configuration",
    ("GET", "/v1/overview"): "per-model totals (queue depth, running) over all tenants, no job named",
    ("GET", "/v1/overview/series"): "no id; users' series count their own jobs only",
    ("POST", "/v1/files"): "names nothing: an upload creates a file of the caller's own tenant",
}

# No key at all.
PUBLIC: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): "liveness", ("GET", "/readyz"): "readiness", ("GET", "/metrics"): "metrics token",
    ("GET", "/metrics/cluster"): "metrics token",
    ("GET", "/openapi.json"): "the document",
    ("GET", "/static/<path:filename>"): "Flask's static files",
    ("GET", "/console/static/<path:filename>"): "the console's files",
    ("GET", "/console/"): "HTML shell", ("GET", "/console/login"): "HTML shell",
    ("GET", "/console/models"): "HTML shell", ("GET", "/console/models/edit"): "HTML shell",
    ("GET", "/console/submit"): "HTML shell", ("GET", "/console/jobs"): "HTML shell",
    ("GET", "/console/jobs/<job_id>"): "HTML shell: no job data; its script calls GET /v1/jobs/{id} with the key",
    ("GET", "/console/tenants"): "HTML shell", ("GET", "/console/workers"): "HTML shell",
    ("GET", "/console/batches"): "HTML shell",
    ("GET", "/console/maintenance"): "HTML shell",
}


def _routes(app) -> set[tuple[str, str]]:
    return {(m, r.rule) for r in app.url_map.iter_rules() for m in r.methods - {"HEAD", "OPTIONS"}}


def test_every_route_is_classified():
    from app import create_app

    classes = [set(TENANT_SCOPED), set(ADMIN_ONLY), set(GLOBAL), set(PUBLIC)]
    routes = _routes(create_app())
    unclassified = routes - set().union(*classes)
    assert not unclassified, f"classify these routes in tests/test_isolation.py: {sorted(unclassified)}"
    assert not set().union(*classes) - routes, "classified routes that do not exist"
    assert sum(len(c) for c in classes) == len(set().union(*classes)), "a route is classified twice"
    with_params = {(m, r) for m, r in routes if "<" in r}
    assert with_params <= set(TENANT_SCOPED) | set(ADMIN_ONLY) | set(GLOBAL) | set(PUBLIC)


def test_a_new_route_with_an_id_fails_the_classification():
    from app import create_app

    app = create_app()
    app.add_url_rule("/v1/jobs/<job_id>/notes", "notes", lambda job_id: "", methods=["GET"])
    classified = set(TENANT_SCOPED) | set(ADMIN_ONLY) | set(GLOBAL) | set(PUBLIC)
    assert _routes(app) - classified == {("GET", "/v1/jobs/<job_id>/notes")}


def test_admin_only_routes_are_the_documents_admin_operations():
    from app import create_app
    from app.web.openapi import document

    doc = document(create_app())
    marked = {(m.upper(), p) for p, item in doc["paths"].items() for m, o in item.items()
              if m != "parameters" and o.get("x-admin-only")}
    listed = {(m, p) for m, rule in ADMIN_ONLY for p in _openapi_paths(rule)}
    assert marked == listed


# --- the world: tenant A's things ---------------------------------------------------------

@pytest.fixture
def world(make_model, client):
    from datetime import timedelta

    from app import transitions
    from app.catalog import model_types
    from app.catalog.schemas import ModelTypeInput
    from app.clock import now
    from app.config import get_settings, set_settings
    from app.infra.db import transaction
    from app.infra.storage import get_storage
    from app.delivery import subscriptions
    from app.infra.tables import api_keys
    from app.infra.tables import deliveries as webhook_deliveries
    from app.jobs import service as jobs
    from app.jobs import stats
    from app.jobs import effects
    from app.jobs.service import SubmitOptions
    from app.tenancy.keys import Principal

    admin, key_a, key_b = make_key("ops", admin=True), make_key(A), make_key(B)
    model_types.create_type(ModelTypeInput(**{"type_id": 1, "type_name": "chat"}))
    with transaction() as conn:
        a_key_id = conn.execute(select(api_keys.c.id).where(api_keys.c.tenant_id == A)).scalar_one()
    make_model(MODEL, form=[{"field": "prompt", "type": "string", "required": True}])
    make_model("idle")
    s = get_settings()
    set_settings(s.with_overrides(callback_allow_hosts="127.0.0.1"))
    try:
        pa = Principal(A, "user", None)
        a_webhook = subscriptions.create(pa, A, "http://93.184.216.34/a", ["done"])["id"]
        pending = jobs.submit(pa, MODEL, {"prompt": "p"}, SubmitOptions(idempotency_key="idem-a")).row.id
        done = jobs.submit(pa, MODEL, {"prompt": "d"}, SubmitOptions(callback_url="http://127.0.0.1:9/cb")).row.id
    finally:
        set_settings(s)
    body = b'{"answer": 42}'
    with transaction() as conn:
        transitions.claim(conn, done, 0, now() + timedelta(hours=1))
        loc = get_storage().put(done, body, "application/json")
        row = transitions.complete(conn, done, 1, location=loc, content_type="application/json", size=len(body))
        conn.execute(*stats.call_counted(conn, now().date(), A, "", MODEL))
        # The done transition wrote A's webhook delivery; it failed (a replay's target).
        a_delivery = conn.execute(update(webhook_deliveries).where(webhook_deliveries.c.job_id == done,
                                                                         webhook_deliveries.c.kind == "webhook")
                                  .values(status="failed", attempts=3).returning(webhook_deliveries.c.id)).scalar_one()
    effects.run(row)  # the slot back, the deliveries' bell rung
    from app.files import service as files_service

    from app.batches import service as batch_service
    from app.batches.schemas import BatchCreate

    a_file = files_service.store(A, "a.jsonl", "batch", iter([b'{"a": 1}\n'])).id
    a_batch = batch_service.create(A, BatchCreate(input_file_id=a_file, endpoint="/v1/chat/completions",
                                                  completion_window="24h")).id  # failed: its line is no request
    assert client.get(f"/v1/tenants/{A}/callback-secret", headers=auth(key_a)).status_code == 200
    return {"admin": admin, "a": key_a, "b": key_b, "pending": pending, "done": done, "model": MODEL,
            "a_key_id": a_key_id, "a_webhook": a_webhook, "a_delivery": a_delivery, "a_file": a_file,
            "a_batch": a_batch}


def snapshot(r, a_jobs: tuple[str, ...], exclude_tenant: str | None = None) -> dict:
    """Every row of every table (except rows of ``exclude_tenant``), the gate
    slots of A's jobs, the permits, dispatch queues and runtime limits
    (except ``exclude_tenant``'s own)."""
    from app.infra.db import transaction
    from app.infra.tables import metadata

    out = {}
    with transaction() as conn:
        for t in metadata.sorted_tables:
            rows = [tuple(row) for row in conn.execute(select(t))
                    if exclude_tenant is None or getattr(row, "tenant_id", None) != exclude_tenant]
            out[t.name] = sorted(rows, key=repr)
    for k in sorted(r.keys("*")):
        if exclude_tenant is not None and k.endswith(":" + exclude_tenant):
            continue  # the other tenant's own permits, queue and share
        if ":gate:" in k or ":tgate:" in k:
            out[k] = sorted(m for m in r.zrange(k, 0, -1) if m in a_jobs)
        elif ":sem:" in k or ":runtime:" in k or ":dq:ready:" in k:
            out[k] = r.dump(k)
    return out


def _fill(value, w: dict):
    if isinstance(value, str):
        return value.format(**w)
    if isinstance(value, dict):
        return {k: _fill(v, w) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, w) for v in value]
    return value


def _call(client, case: dict, w: dict, key: str, **subst):
    ww = {**w, **subst}
    return client.open(_fill(case["url"], ww), method=case.get("method", "GET"), json=_fill(case.get("json"), ww),
                       headers={**auth(key), **case.get("headers", {})})


def _tenant_cases():
    return [pytest.param(route, i, id=f"{route[0]} {route[1]} #{i}")
            for route, cases in TENANT_SCOPED.items() for i in range(len(cases))]


@pytest.mark.parametrize("route,i", _tenant_cases())
def test_another_tenant_gets_not_found_and_changes_nothing(client, world, r, route, i):
    case = TENANT_SCOPED[route][i]
    a_jobs = (world["pending"], world["done"])
    before = snapshot(r, a_jobs, exclude_tenant=B)
    if route == ("GET", "/v1/events"):  # a stream that ends by itself within a second
        from app.config import get_settings, set_settings

        set_settings(get_settings().with_overrides(events_max_seconds=0.5, events_poll_seconds=0.05,
                                                   events_keepalive_seconds=0.2))
    if case.get("seed000"):  # the seed-000 routes serve the world's model
        from app.config import get_settings, set_settings

        set_settings(get_settings().with_overrides(seed000_model=MODEL))
    resp = _call(client, case, world, world["b"])
    expect = case["expect"]
    body = resp.get_json() if resp.is_json else None
    if isinstance(expect, int):
        assert resp.status_code == expect, resp.get_data(as_text=True)
        # the same answer as for an id that never existed: nothing to tell A's ids apart by
        never = _call(client, case, world, world["b"], pending=NEVER, done=NEVER, a_file="file-" + "0" * 24,
                      a_batch="batch_" + "0" * 24)
        never.close()
        assert never.status_code == resp.status_code
        if route[1].startswith(("/task/", "/stat/")):
            assert body["code"] == expect and body["data"] is None  # the seed envelope's form
    elif expect == "empty":
        assert resp.status_code == 200 and body["jobs"] == []
    elif expect == "no data":
        assert resp.status_code == 200 and body["data"] == [], body
    elif expect == "own tenant only":
        assert resp.status_code == 200 and body == {"tenants": [B], "caller": B}, body
    elif expect == "new job":
        assert resp.status_code in (200, 202), resp.get_data(as_text=True)
        new = body.get("job_id") or body["data"]["task_id"]
        assert new not in a_jobs
    elif expect == "no events of A":
        text = resp.get_data(as_text=True)
        assert resp.status_code == 200 and "retry:" in text, text
        assert not any(j in text for j in a_jobs), text
    elif expect == "new batch job":
        assert resp.status_code == 207, resp.get_data(as_text=True)
        (item,) = body["results"]
        assert item["status"] == 202 and item["job_id"] not in a_jobs, item
    elif expect == "batch not found":
        assert resp.status_code == 200
        assert [(e["task_id"], e["state"], e["claimed"], e.get("error")) for e in body["data"]] == [
            (j, None, False, "task not found") for j in a_jobs]
    else:
        raise AssertionError(expect)
    assert snapshot(r, a_jobs, exclude_tenant=B) == before, "another tenant's call changed tenant A's state"

    # The same request with A's own key reaches the thing (the case names it right).
    own = _call(client, case, world, world["a"])
    owner = case["owner"]
    if owner == "mine":
        assert own.status_code == 200 and {j["job_id"] for j in own.get_json()["jobs"]} == set(a_jobs)
    elif owner == "my data":
        assert own.status_code == 200 and [f["id"] for f in own.get_json()["data"]] == [world["a_file"]]
    elif owner == "my batch":
        assert own.status_code == 200 and [b["id"] for b in own.get_json()["data"]] == [world["a_batch"]]
    elif owner == "replay":
        got = own.get_json().get("job_id") or own.get_json()["data"]["task_id"]
        assert own.status_code in (200, 202) and got == world["pending"]
    elif owner == "own tenant only":
        assert own.status_code == 200 and own.get_json() == {"tenants": ["tenant-a"], "caller": "tenant-a"}
    elif owner == "events of mine":
        text = own.get_data(as_text=True)
        assert own.status_code == 200 and all(j in text for j in a_jobs), text
    elif owner == "batch replay":
        data = own.get_json()
        (item,) = data["results"]
        assert own.status_code == 207 and item["job_id"] == world["pending"], data
    elif owner == "batch claimed":
        data = own.get_json()["data"]
        assert [(e["state"], e["claimed"]) for e in data] == [(0, False), (2, True)]
    else:
        assert own.status_code == owner, own.get_data(as_text=True)
    # A WSGI server closes every response it serves (PEP 3333); the test
    # client does not, and an unread event stream keeps its waiter place
    # until it is closed.
    for done_with in (resp, own):
        done_with.close()
    from app.infra.wakeups import hub

    assert hub.total == 0, "a closed response kept a waiter place"


def _admin_cases():
    return [pytest.param(route, i, id=f"{route[0]} {route[1]} #{i}")
            for route, reqs in ADMIN_ONLY.items() for i in range(len(reqs))]


@pytest.mark.parametrize("route,i", _admin_cases())
def test_a_user_key_gets_403_on_admin_routes_and_changes_nothing(client, world, r, route, i):
    method, _rule = route
    url, body = ADMIN_ONLY[route][i]
    url = url.format(**world)
    a_jobs = (world["pending"], world["done"])
    before = snapshot(r, a_jobs)
    for key in (world["a"], world["b"]):
        resp = client.open(url, method=method, json=body, headers=auth(key))
        assert resp.status_code == 403, (url, resp.status_code, resp.get_data(as_text=True))
        if url.startswith(("/model/", "/modelType/", "/task/")):
            assert resp.get_json()["code"] == 403
    assert snapshot(r, a_jobs) == before, "a user key changed something through an admin route"
    resp = client.open(url, method=method, json=body, headers=auth(world["admin"]))
    assert resp.status_code not in (401, 403) and resp.status_code < 500, (url, resp.status_code)


def test_a_users_own_secret_and_stats_are_theirs(client, world):
    """The 403s above are about OTHER tenants: a user reads its own."""
    h = auth(world["b"])
    assert client.get(f"/v1/tenants/{B}/callback-secret", headers=h).status_code == 200
    assert client.get(f"/v1/stats?tenant={B}", headers=h).get_json()["rows"] == []
    assert client.get("/v1/stats", headers=h).get_json()["rows"] == []  # not A's count
    assert client.get("/v1/stats", headers=auth(world["a"])).get_json()["total"] == 1
    series = client.get("/v1/overview/series", headers=h).get_json()
    assert all(b["done"] == 0 for buckets in series["models"].values() for b in buckets)
