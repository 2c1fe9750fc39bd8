"""The OpenAPI document is valid 3.1, matches the registered routes both ways
(so a route added without documentation fails here), and real responses
match the schemas it documents for their status."""
from __future__ import annotations

import re
from functools import cache

import pytest
from helpers import auth
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from app import create_app
from app.web.openapi import document, undocumented

_SKIP_METHODS = {"HEAD", "OPTIONS"}


def _openapi_paths(rule: str) -> list[str]:
    """The documented path(s) of a url rule: <conv:name> -> {name}; an
    any(a, b) converter is documented as one concrete path per choice."""
    m = re.search(r"<any\(([^)]*)\):[A-Za-z_]+>", rule)
    if m:
        return [p for choice in m.group(1).split(",")
                for p in _openapi_paths(rule[:m.start()] + choice.strip() + rule[m.end():])]
    return [re.sub(r"<(?:[a-z_]+:)?([A-Za-z_]+)>", r"{\1}", rule)]


def route_differences(app, doc: dict) -> tuple[set, set]:
    """(registered but undocumented, documented but not registered)."""
    registered = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.endswith(".static"):
            continue
        for path in _openapi_paths(rule.rule):
            for m in rule.methods - _SKIP_METHODS:
                registered.add((path, m.lower()))
    documented = {(p, m) for p, item in doc["paths"].items() for m in item if m != "parameters"}
    return registered - documented, documented - registered


def test_document_is_valid_openapi_3_1():
    doc = document(create_app())
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_route_is_documented_and_nothing_else_is():
    app = create_app()
    missing, extra = route_differences(app, document(app))
    assert missing == set(), f"routes without documentation: {sorted(missing)}"
    assert extra == set(), f"documented routes that do not exist: {sorted(extra)}"


def test_a_route_added_without_a_declaration_is_caught():
    app = create_app()
    app.add_url_rule("/v1/undocumented/<int:n>", "undocumented", lambda n: "", methods=["GET", "POST"])
    assert undocumented(app) == ["/v1/undocumented/<int:n>"]
    with pytest.raises(ValueError, match="undocumented"):
        document(app)


def test_served_document_is_the_generated_document(client):
    resp = client.get("/openapi.json")
    assert resp.status_code == 200
    assert resp.get_json() == document(client.application)


def _resolve(node, doc):
    if isinstance(node, dict):
        if "$ref" in node:
            target = doc
            for part in node["$ref"].lstrip("#/").split("/"):
                target = target[part]
            return _resolve(target, doc)
        return {k: _resolve(v, doc) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, doc) for v in node]
    return node


@cache
def _operation(path: str, method: str) -> dict:
    """The documented operation, its $refs resolved.  The document is built
    once per process (building it is ~0.3 CPU-s, and the real-responses test
    checks ~80 responses): it depends only on the registered routes, which no
    request changes, and test_served_document_is_the_generated_document
    checks that the served document is this generated one."""
    doc = _document()
    return _resolve(doc["paths"][path][method], doc)


@cache
def _document() -> dict:
    return document(create_app())


def conforms(resp, path: str, method: str) -> None:
    """The response's status is documented for the operation, and a JSON body
    matches its schema."""
    op = _operation(path, method)
    documented = op["responses"].get(str(resp.status_code))
    assert documented is not None, f"{method.upper()} {path} answered undocumented {resp.status_code}"
    content = documented.get("content", {})
    if "application/json" in content:
        OAS31Validator(content["application/json"]["schema"]).validate(resp.get_json())


@pytest.mark.e2e
def test_real_responses_match_the_documented_schemas(client, make_model, admin_key, user_key, workers):
    make_model("echo", form=[{"field": "prompt", "type": "string", "required": True}], head_msg="K:v")
    h = auth(user_key)
    conforms(client.get("/v1/models", headers=h), "/v1/models", "get")
    conforms(client.get("/v1/models", headers=auth(admin_key)), "/v1/models", "get")
    conforms(client.get("/v1/models/echo", headers=h), "/v1/models/{name}", "get")
    conforms(client.get("/v1/models/nope", headers=h), "/v1/models/{name}", "get")
    conforms(client.get("/v1/models"), "/v1/models", "get")
    conforms(client.post("/v1/models", json={"model_name": "x"}, headers=auth(admin_key)), "/v1/models", "post")
    conforms(client.post("/v1/models", json={"model_name": "x"}, headers=h), "/v1/models", "post")
    bad = client.post("/v1/models/echo/jobs", json={}, headers=h)
    assert bad.status_code == 422
    conforms(bad, "/v1/models/{model}/jobs", "post")
    ok = client.post("/v1/models/echo/jobs", json={"prompt": "hi"}, headers=h)
    conforms(ok, "/v1/models/{model}/jobs", "post")
    job = ok.get_json()
    conforms(client.get(job["poll_url"], headers=h), "/v1/models/{model}/jobs/{job_id}", "get")
    conforms(client.get(job["poll_url"] + "/wait?timeout=20000", headers=h),
             "/v1/models/{model}/jobs/{job_id}/wait", "get")
    conforms(client.get(job["result_url"], headers=h), "/v1/models/{model}/jobs/{job_id}/result", "get")
    conforms(client.post(job["poll_url"] + "/cancel", headers=h), "/v1/models/{model}/jobs/{job_id}/cancel", "post")
    conforms(client.get("/v1/jobs?since=2000-01-01T00:00:00Z", headers=h), "/v1/jobs", "get")
    conforms(client.get("/v1/jobs?since=yesterday", headers=h), "/v1/jobs", "get")
    conforms(client.get("/v1/models/echo/jobs?limit=1", headers=h), "/v1/models/{model}/jobs", "get")
    created = client.post("/v1/keys", json={"tenant": "t1"}, headers=auth(admin_key))
    conforms(created, "/v1/keys", "post")
    conforms(client.get("/v1/keys", headers=auth(admin_key)), "/v1/keys", "get")
    conforms(client.delete(f"/v1/keys/{created.get_json()['id']}", headers=auth(admin_key)),
             "/v1/keys/{key_id}", "delete")
    conforms(client.get("/v1/overview", headers=h), "/v1/overview", "get")
    conforms(client.get("/v1/overview/series", headers=h), "/v1/overview/series", "get")
    conforms(client.get("/v1/overview/series?minutes=2", headers=h), "/v1/overview/series", "get")
    conforms(client.get(f"/v1/jobs/{job['job_id']}", headers=h), "/v1/jobs/{job_id}", "get")
    conforms(client.get("/v1/jobs/job_nope", headers=h), "/v1/jobs/{job_id}", "get")
    # the seed face: envelopes, and enveloped errors
    a = auth(admin_key)
    conforms(client.get("/model/listModel", headers=h), "/model/listModel", "get")
    conforms(client.get("/model/getModel?modelName=echo", headers=a), "/model/getModel", "get")
    conforms(client.get("/model/getModel", headers=h), "/model/getModel", "get")
    conforms(client.get("/model/getModel?modelName=nope", headers=h), "/model/getModel", "get")
    conforms(client.get("/model/listModel"), "/model/listModel", "get")
    conforms(client.post("/model/createModel", json={"modelName": "s1"}, headers=a), "/model/createModel", "post")
    conforms(client.post("/model/createModel", json={"modelName": "s1", "baseUrl": "http://127.0.0.1:1"}, headers=h),
             "/model/createModel", "post")
    conforms(client.post("/modelType/create", json={"typeName": "chat"}, headers=a), "/modelType/create", "post")
    conforms(client.get("/modelType/list", headers=h), "/modelType/list", "get")
    task = client.post("/task/createTask", json={"modelName": "echo", "requestPayload": {"prompt": "x"}}, headers=h)
    conforms(task, "/task/createTask", "post")
    conforms(client.post("/task/createTask", json={"modelName": "echo"}, headers=h), "/task/createTask", "post")
    tid = task.get_json()["data"]["task_id"]
    conforms(client.post("/task/getTaskBatch", json={"taskIds": [tid, "job_nope"]}, headers=h),
             "/task/getTaskBatch", "post")
    conforms(client.get(f"/task/getTaskResult?taskId={tid}", headers=h), "/task/getTaskResult", "get")
    conforms(client.get("/stat/getModelStat", headers=h), "/stat/getModelStat", "get")
    conforms(client.post("/task/runWork", headers=a), "/task/runWork", "post")
    conforms(client.post("/task/cleanWork", headers=h), "/task/cleanWork", "post")
    conforms(client.post("/model/autoTune", json={"dryRun": True}, headers=a), "/model/autoTune", "post")
    # v1 business and maintenance
    conforms(client.get("/v1/stats?from=2000-01-01", headers=h), "/v1/stats", "get")
    conforms(client.get("/v1/stats?tenant=other", headers=h), "/v1/stats", "get")
    conforms(client.get("/v1/model-types", headers=h), "/v1/model-types", "get")
    conforms(client.patch("/v1/model-types/1", json={"remark": "r"}, headers=a), "/v1/model-types/{type_id}", "patch")
    conforms(client.get(f"/v1/jobs/{tid}/callback", headers=h), "/v1/jobs/{job_id}/callback", "get")
    conforms(client.get(f"/v1/jobs/{tid}/deliveries", headers=h), "/v1/jobs/{job_id}/deliveries", "get")
    conforms(client.get("/v1/tenants/tenant-a/callback-secret", headers=h),
             "/v1/tenants/{tenant}/callback-secret", "get")
    conforms(client.post("/v1/tenants/tenant-a/callback-secret/rotate", headers=a),
             "/v1/tenants/{tenant}/callback-secret/rotate", "post")
    for name in ("retry", "recover", "cleanup", "reconcile"):
        conforms(client.post(f"/v1/maintenance/{name}", headers=a), f"/v1/maintenance/{name}", "post")
    conforms(client.post("/v1/maintenance/autotune", json={"dry_run": "yes"}, headers=a),
             "/v1/maintenance/autotune", "post")
    conforms(client.get("/v1/maintenance/runs?limit=5", headers=a), "/v1/maintenance/runs", "get")
    # the console's operator views
    conforms(client.get("/v1/maintenance/state", headers=a), "/v1/maintenance/state", "get")
    conforms(client.get("/v1/maintenance/state", headers=h), "/v1/maintenance/state", "get")
    conforms(client.get("/v1/workers", headers=a), "/v1/workers", "get")
    conforms(client.get("/v1/tenants", headers=a), "/v1/tenants", "get")
    conforms(client.get("/v1/tenants", headers=h), "/v1/tenants", "get")
    conforms(client.get("/v1/tenants/tenant-a/state", headers=h), "/v1/tenants/{tenant}/state", "get")
    conforms(client.get("/v1/tenants/other/state", headers=h), "/v1/tenants/{tenant}/state", "get")
    conforms(client.get("/v1/tenants/tenant-a/state", headers=a), "/v1/tenants/{tenant}/state", "get")
    conforms(client.get("/metrics"), "/metrics", "get")
    conforms(client.get("/openapi.json"), "/openapi.json", "get")
    conforms(client.get("/healthz"), "/healthz", "get")
    conforms(client.get("/readyz"), "/readyz", "get")


def test_listing_filters_by_time_range(client, make_model, user_key):
    make_model("echo")
    h = auth(user_key)
    job = client.post("/v1/models/echo/jobs", json={"a": 1}, headers=h).get_json()
    ids = lambda q: [j["job_id"] for j in client.get("/v1/jobs" + q, headers=h).get_json()["jobs"]]  # noqa: E731
    assert ids("?since=2000-01-01T00:00:00Z") == [job["job_id"]]
    assert ids("?until=2000-01-01T00:00:00") == []
    assert ids("?since=2999-01-01T00:00:00%2B00:00") == []
    bad = client.get("/v1/jobs?until=soon", headers=h)
    assert bad.status_code == 422 and bad.get_json()["errors"][0]["pointer"] == "/until"
