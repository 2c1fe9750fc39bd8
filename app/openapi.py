"""The OpenAPI 3.1 document served at /openapi.json.

Paths are kept in one dict PER BLUEPRINT (``PATHS["v1_jobs"]`` documents
exactly the rules of the ``v1_jobs`` blueprint), so whoever adds a blueprint
adds its own entry and touches nothing else.  tests/test_openapi.py compares
this document with the app's url_map both ways: an undocumented route or a
documented route that does not exist fails the suite.

Every operation lists every status it can answer; ``op()`` adds the ones
that follow from how it is reached (401/503 behind a key, 404 for a path
with parameters, 413 for a body).  405 is answered by every path for a
method it does not list (component ``MethodNotAllowed``).
"""
from __future__ import annotations

from typing import Any

from app.states import _V1_NAMES

V1_STATES = sorted(set(_V1_NAMES.values()))

_S = "#/components/schemas/"
_R = "#/components/responses/"


def ref(name: str) -> dict:
    return {"$ref": _S + name}


def _json(schema: dict, description: str, headers: dict | None = None) -> dict:
    out = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again",
                                "schema": {"type": "string"}}}

RESPONSES: dict[str, dict] = {
    "BadRequest": _json(ref("Error"), "the body is empty, not JSON, or not a JSON object"),
    "Unauthorized": _json(ref("Error"), "missing or invalid API key", {
        "WWW-Authenticate": {"schema": {"type": "string"}, "description": 'Bearer realm="asynch"'}}),
    "Forbidden": _json(ref("Error"), "an admin key is required"),
    "NotFound": _json(ref("Error"), "no such resource (or it belongs to another tenant)"),
    "MethodNotAllowed": _json(ref("Error"), "the path does not take this method", {
        "Allow": {"schema": {"type": "string"}, "description": "the methods it takes"}}),
    "Conflict": _json(ref("Error"), "the resource is in a state that refuses this"),
    "Gone": _json(ref("Error"), "the stored result has been cleaned up"),
    "TooLarge": _json(ref("Error"), "the body is over ASYNCH_MAX_BODY_BYTES"),
    "Invalid": _json(ref("ValidationError"), "invalid fields, each with a JSON pointer"),
    "QueueFull": _json(ref("Error"), "the model's queue is full: async queue full (max N)", _RETRY_AFTER),
    "Unavailable": _json(ref("Error"), "a dependency (database, Redis) is down; nothing was changed",
                         _RETRY_AFTER),
}
_CODE_TO_RESPONSE = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                     405: "MethodNotAllowed", 409: "Conflict", 410: "Gone", 413: "TooLarge",
                     422: "Invalid", 429: "QueueFull", 503: "Unavailable"}

_ISO = {"type": "string", "format": "date-time"}
_ISO_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
_POINTER_ERRORS = {"type": "array", "items": {
    "type": "object", "required": ["pointer", "message"],
    "properties": {"pointer": {"type": "string"}, "message": {"type": "string"}}}}

_MODEL_FIELDS: dict[str, dict] = {
    "model_name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"},
    "models_type": {"type": "string", "description": "comma list of model type ids, e.g. 1,2"},
    "form": {"type": ["array", "null"], "items": ref("FormField")},
    "base_url": {"type": "string", "format": "uri"},
    "route": {"type": "string"},
    "http_method": {"type": "string", "enum": ["GET", "POST"]},
    "head_msg": {"type": "string", "description": "K:V,K2:V2 headers; secret, shown back as K:***"},
    "enabled": {"type": "boolean"},
    "max_concurrency": {"type": "integer"},
    "queue_limit": {"type": "integer"},
    "timeout_seconds": {"type": "integer"},
    "expected_seconds": {"type": "integer"},
    "retry_times": {"type": "integer"},
    "retry_queue_max_seconds": {"type": "integer"},
    "auto_clean_seconds": {"type": "integer"},
    "remark": {"type": "string"},
}

_JOB_STATUS_PROPS = {
    "job_id": {"type": "string", "pattern": "^job_"},
    "model": {"type": "string"},
    "state": {"type": "string", "enum": V1_STATES},
    "elapsed_ms": {"type": "integer", "minimum": 0},
    "attempt": {"type": "integer"},
    "retry_count": {"type": "integer"},
    "created_at": _ISO,
    "started_at": _ISO_OR_NULL,
    "finished_at": _ISO_OR_NULL,
    "error": {"type": "string"},
    "result_size": {"type": "integer"},
    "content_type": {"type": ["string", "null"]},
}

SCHEMAS: dict[str, dict] = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "ValidationError": {"type": "object", "required": ["error", "errors"], "properties": {
        "error": {"type": "string"}, "errors": _POINTER_ERRORS}},
    "FormField": {"type": "object", "required": ["field"], "properties": {
        "field": {"type": "string"}, "label": {"type": "string"},
        "type": {"type": "string", "enum": ["string", "text", "number", "integer", "boolean", "select",
                                            "array", "object", "url", "image"]},
        "required": {"type": "boolean"}, "options": {"type": "array"},
        "minLength": {"type": "integer"}, "maxLength": {"type": "integer"},
        "min": {"type": "number"}, "max": {"type": "number"}, "pattern": {"type": "string"}}},
    "JobAccepted": {"type": "object", "required": ["job_id", "state", "poll_url", "result_url"], "properties": {
        "job_id": {"type": "string", "pattern": "^job_"}, "state": {"type": "string", "enum": V1_STATES},
        "poll_url": {"type": "string"}, "result_url": {"type": "string"}}},
    "JobStatus": {"type": "object", "description": "the poll body",
                  "required": ["job_id", "model", "state", "elapsed_ms", "attempt", "retry_count", "created_at",
                               "started_at", "finished_at"],
                  "properties": _JOB_STATUS_PROPS},
    "JobListItem": {"allOf": [ref("JobStatus"), {"type": "object", "required": ["poll_url", "result_url"],
                                                 "properties": {"poll_url": {"type": "string"},
                                                                "result_url": {"type": "string"}}}]},
    "JobList": {"type": "object", "required": ["jobs", "next_cursor"], "properties": {
        "jobs": {"type": "array", "items": ref("JobListItem")},
        "next_cursor": {"type": ["string", "null"]}}},
    "Model": {"type": "object", "required": ["model_name"], "description":
              "admins see every field; other keys see model_name, models_type, form, enabled, "
              "expected_seconds, timeout_seconds, queue_limit, max_concurrency, remark",
              "properties": {**_MODEL_FIELDS, "created_at": _ISO_OR_NULL, "updated_at": _ISO_OR_NULL}},
    "ModelInput": {"type": "object", "required": ["model_name", "base_url"], "additionalProperties": False,
                   "properties": _MODEL_FIELDS},
    "ModelPatch": {"type": "object", "additionalProperties": False, "properties": _MODEL_FIELDS},
    "ModelList": {"type": "object", "required": ["models"], "properties": {
        "models": {"type": "array", "items": ref("Model")}}},
    "ApiKey": {"type": "object", "required": ["id", "tenant", "role", "name", "prefix", "created_at", "revoked_at"],
               "properties": {"id": {"type": "integer"}, "tenant": {"type": "string"},
                              "role": {"type": "string", "enum": ["admin", "user"]}, "name": {"type": "string"},
                              "prefix": {"type": "string"}, "created_at": _ISO, "revoked_at": _ISO_OR_NULL}},
    "ApiKeyCreated": {"allOf": [ref("ApiKey"), {"type": "object", "required": ["key"], "properties": {
        "key": {"type": "string", "description": "the key itself, shown once"}}}]},
    "ApiKeyInput": {"type": "object", "required": ["tenant"], "properties": {
        "tenant": {"type": "string"}, "role": {"type": "string", "enum": ["admin", "user"]},
        "admin": {"type": "boolean"}, "name": {"type": "string"}}},
    "ApiKeyList": {"type": "object", "required": ["keys"], "properties": {
        "keys": {"type": "array", "items": ref("ApiKey")}}},
    "ModelLive": {"type": "object", "required": ["model_name", "enabled", "queue_depth", "queue_limit", "running",
                                                 "max_concurrency", "runtime"], "properties": {
        "model_name": {"type": "string"}, "enabled": {"type": "boolean"},
        "queue_depth": {"type": "integer", "description": "gate slots taken (pending + running)"},
        "queue_limit": {"type": "integer", "description": "effective: runtime override capped by the configuration"},
        "queue_limit_configured": {"type": "integer"},
        "running": {"type": "integer"}, "pending": {"type": "integer"}, "retry_wait": {"type": "integer"},
        "max_concurrency": {"type": "integer"}, "max_concurrency_configured": {"type": "integer"},
        "runtime": {"type": "object", "description": "autotune's overrides (null: none)", "properties": {
            "queue_limit": {"type": ["integer", "null"]}, "max_concurrency": {"type": ["integer", "null"]}}}}},
    "Overview": {"type": "object", "required": ["models"], "properties": {
        "models": {"type": "array", "items": ref("ModelLive")}}},
    "Series": {"type": "object", "required": ["since", "bucket_minutes", "models"], "properties": {
        "since": _ISO, "bucket_minutes": {"type": "integer"},
        "models": {"type": "object", "additionalProperties": {"type": "array", "items": {
            "type": "object", "required": ["done", "p90_seconds"], "properties": {
                "done": {"type": "integer"}, "p90_seconds": {"type": ["number", "null"]}}}}}}},
    "JobDetail": {"allOf": [ref("JobStatus"), {"type": "object", "required": ["timeline", "tenant", "internal_state"],
                                               "properties": {
        "internal_state": {"type": "string", "enum": ["pending", "running", "done", "failed", "claimed", "timeout",
                                                      "canceled", "retry_wait"]},
        "tenant": {"type": "string"}, "creator": {"type": "string"}, "biz_name": {"type": "string"},
        "enqueue_at": _ISO_OR_NULL, "next_retry_at": _ISO_OR_NULL, "deadline_at": _ISO_OR_NULL,
        "claimed_at": _ISO_OR_NULL, "expire_at": _ISO_OR_NULL, "payload": {},
        "poll_url": {"type": "string"}, "result_url": {"type": "string"},
        "timeline": {"type": "array", "items": {"type": "object", "required": ["at", "event", "detail"],
                                                "properties": {"at": _ISO_OR_NULL, "event": {"type": "string"},
                                                               "detail": {"type": "string"}}}}}}]},
    "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
    "Ready": {"type": "object", "required": ["status", "checks"], "properties": {
        "status": {"type": "string", "enum": ["ok", "unavailable"]},
        "checks": {"type": "object", "additionalProperties": {"type": "string"}},
        "error": {"type": "string"}}},
}

BEARER = [{"bearerAuth": []}]
NO_AUTH: list = []


def op(summary: str, ok: dict[int, dict], errors: tuple[int, ...] = (), *, tag: str,
       params: list | None = None, body: dict | None = None, auth: list | None = None,
       path_params: bool = False, description: str | None = None) -> dict:
    """One operation.  ``ok`` maps success codes to response objects; error
    codes become $refs to the shared responses, plus those implied by
    authentication (401, and 503 when the key lookup cannot reach the
    database), path parameters (404) and a body (400, 413)."""
    security = BEARER if auth is None else auth
    codes = set(errors)
    if security == BEARER:
        codes |= {401, 503}
    if path_params:
        codes.add(404)
    if body is not None:
        codes |= {400, 413}
    out: dict[str, Any] = {"summary": summary, "tags": [tag], "security": security,
                           "responses": {str(c): r for c, r in sorted(ok.items())}}
    for c in sorted(codes):
        out["responses"][str(c)] = {"$ref": _R + _CODE_TO_RESPONSE[c]}
    if description:
        out["description"] = description
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return out


def path_param(name: str, schema: dict | None = None, description: str = "") -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema or {"type": "string"},
            "description": description}


def query(name: str, schema: dict, description: str = "") -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def header(name: str, description: str) -> dict:
    return {"name": name, "in": "header", "required": False, "schema": {"type": "string"},
            "description": description}


_MODEL = path_param("model", description="model_name")
_JOB = path_param("job_id", description="job id (job_...)")
_LIST_QUERY = [
    query("state", {"type": "string", "enum": V1_STATES}),
    query("limit", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}),
    query("cursor", {"type": "string"}, "next_cursor of the previous page"),
    query("tenant", {"type": "string"}, "admins: only this tenant's jobs"),
    query("since", _ISO, "only jobs created at or after this time (ISO 8601)"),
    query("until", _ISO, "only jobs created before this time (ISO 8601)"),
]

_POLL = _json(ref("JobStatus"), "the poll body")

# --- paths, one dict per blueprint ---------------------------------------------------------

PATHS: dict[str, dict[str, dict]] = {}

PATHS["health"] = {
    "/healthz": {"get": op("Liveness: the process answers", {200: _json(ref("Health"), "alive")},
                           tag="health", auth=NO_AUTH)},
    "/readyz": {"get": op("Readiness: PostgreSQL and Redis answer",
                          {200: _json(ref("Ready"), "ready"), 503: _json(ref("Ready"), "a dependency is down")},
                          tag="health", auth=NO_AUTH)},
}

PATHS["v1_jobs"] = {
    "/v1/models/{model}/jobs": {
        "parameters": [_MODEL],
        "post": op("Submit a job", {202: _json(ref("JobAccepted"), "admitted", {
            "Location": {"schema": {"type": "string"}, "description": "the poll_url"},
            "Idempotent-Replayed": {"schema": {"type": "string"}, "description": "true on a replay"}})},
            (422, 429), tag="jobs", path_params=True,
            body={"type": "object", "description": "the JSON object forwarded to the model service"},
            params=[header("Idempotency-Key", "1-255 printable ASCII; the same key returns the first job"),
                    header("X-Model-Key", "K:V,K2:V2 headers for this job only (secret)"),
                    header("X-Biz-Name", "business name (callbacks)"),
                    header("X-Creator", "who submitted it (stats)")],
            description="Checks run in order: key, body size, JSON, model (404 unknown or disabled), "
                        "form (422), idempotency, gate (429). Nothing before the gate takes a slot."),
        "get": op("List a model's jobs, newest first", {200: _json(ref("JobList"), "a page")}, (422,),
                  tag="jobs", path_params=True, params=_LIST_QUERY),
    },
    "/v1/jobs": {
        "get": op("List jobs, newest first", {200: _json(ref("JobList"), "a page")}, (422,),
                  tag="jobs", params=_LIST_QUERY),
    },
    "/v1/models/{model}/jobs/{job_id}": {
        "parameters": [_MODEL, _JOB],
        "get": op("Poll a job", {200: _POLL}, tag="jobs", path_params=True),
    },
    "/v1/models/{model}/jobs/{job_id}/wait": {
        "parameters": [_MODEL, _JOB],
        "get": op("Long-poll a job until it is terminal or the budget ends", {200: _POLL}, tag="jobs",
                  path_params=True, params=[query("timeout", {"type": "integer"},
                                                  "milliseconds; default 30000, cap 300000; <=0 means default")]),
    },
    "/v1/models/{model}/jobs/{job_id}/result": {
        "parameters": [_MODEL, _JOB],
        "get": op("The model's stored response", {200: {
            "description": "the response bytes with their Content-Type",
            "content": {"*/*": {"schema": {}}}}}, (409, 410), tag="jobs", path_params=True),
    },
    "/v1/models/{model}/jobs/{job_id}/cancel": {
        "parameters": [_MODEL, _JOB],
        "post": op("Cancel a job", {200: _POLL}, (409,), tag="jobs", path_params=True),
    },
}

PATHS["v1_admin"] = {
    "/v1/models": {
        "get": op("List models (users: enabled ones, fewer fields)", {200: _json(ref("ModelList"), "models")},
                  tag="models"),
        "post": op("Create a model (admin)", {201: _json(ref("Model"), "created")}, (403, 409, 422),
                   tag="models", body=ref("ModelInput")),
    },
    "/v1/models/{name}": {
        "parameters": [path_param("name", description="model_name")],
        "get": op("A model", {200: _json(ref("Model"), "the model")}, tag="models", path_params=True),
        "put": op("Update a model (admin; only the fields given change)", {200: _json(ref("Model"), "updated")},
                  (403, 422), tag="models", path_params=True, body=ref("ModelPatch")),
        "patch": op("Update a model (admin; only the fields given change)", {200: _json(ref("Model"), "updated")},
                    (403, 422), tag="models", path_params=True, body=ref("ModelPatch")),
        "delete": op("Delete a model (admin; 409 while it has active jobs)", {204: {"description": "deleted"}},
                     (403, 409), tag="models", path_params=True),
    },
    "/v1/keys": {
        "get": op("List API keys (admin; never the secrets)", {200: _json(ref("ApiKeyList"), "keys")}, (403,),
                  tag="keys", params=[query("tenant", {"type": "string"})]),
        "post": op("Create an API key (admin); the key is shown once",
                   {201: _json(ref("ApiKeyCreated"), "created")}, (403, 422), tag="keys", body=ref("ApiKeyInput")),
    },
    "/v1/keys/{key_id}": {
        "parameters": [path_param("key_id", {"type": "integer"})],
        "delete": op("Revoke an API key (admin)", {200: _json(ref("ApiKey"), "revoked")}, (403,),
                     tag="keys", path_params=True),
    },
}

PATHS["v1_observe"] = {
    "/v1/overview": {"get": op(
        "Live numbers per model: queue depth vs limit, running vs concurrency, runtime overrides",
        {200: _json(ref("Overview"), "models (users: enabled ones)")}, tag="observe")},
    "/v1/overview/series": {"get": op(
        "Done jobs and P90 created->finished seconds per model, in 12 buckets over the window",
        {200: _json(ref("Series"), "series (users: their own jobs)")}, (422,), tag="observe",
        params=[query("minutes", {"type": "integer", "minimum": 5, "maximum": 1440, "default": 60})])},
    "/v1/jobs/{job_id}": {
        "parameters": [_JOB],
        "get": op("A job with its timeline (the console's job page)", {200: _json(ref("JobDetail"), "the job")},
                  tag="jobs", path_params=True,
                  description="The row keeps the latest attempt only: earlier attempts' errors are not kept."),
    },
}

_HTML = {200: {"description": "the page shell; its script calls the JSON API with the key from sessionStorage",
               "content": {"text/html": {"schema": {"type": "string"}}}}}


def _page(summary: str) -> dict:
    return {"get": op(summary, _HTML, tag="console", auth=NO_AUTH)}


PATHS["console"] = {
    "/console/": {"get": op("The console: redirects to its models page",
                            {302: {"description": "to /console/models"}}, tag="console", auth=NO_AUTH)},
    "/console/login": _page("Console: log in with an API key"),
    "/console/models": _page("Console: models with live queue/running numbers and the last hour's chart"),
    "/console/models/edit": _page("Console: create or edit a model (admins)"),
    "/console/submit": _page("Console: submit a job from the model's form"),
    "/console/jobs": _page("Console: jobs, filtered by model, state, tenant and time"),
    "/console/jobs/{job_id}": {"parameters": [_JOB], **_page("Console: a job, its timeline and its result")},
}

PATHS["docs"] = {
    "/openapi.json": {"get": op("This document", {200: _json({"type": "object"}, "OpenAPI 3.1")},
                                tag="meta", auth=NO_AUTH)},
}

PATHS["metrics"] = {
    "/metrics": {"get": op(
        "Prometheus metrics (text exposition format)",
        {200: {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
         401: {"$ref": _R + "Unauthorized"}},
        tag="meta", auth=[{}, {"metricsToken": []}],
        description="No API key. When ASYNCH_METRICS_TOKEN is set, send it as `Authorization: Bearer <token>` "
                    "(401 otherwise). Counters and histograms are cluster-wide (kept in Redis); gauges are "
                    "read from PostgreSQL and Redis at scrape time; `asynch_metrics_source_up` says which "
                    "answered.")},
}


def document(server_url: str | None = None) -> dict:
    """The whole document; a path documented by two blueprints is a bug."""
    paths: dict[str, dict] = {}
    for bp, entries in PATHS.items():
        for path, item in entries.items():
            if path in paths:
                raise ValueError(f"{path} documented twice (blueprint {bp})")
            paths[path] = item
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "model-asynch", "version": "1.0.0",
                 "description": "Asynchronous model-inference jobs. Every error body has an `error` string; "
                                "422 adds `errors: [{pointer, message}]`. A method a path does not list "
                                "answers 405 with `Allow`."},
        "security": BEARER,
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "responses": RESPONSES,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "an API key (ak_...)"},
                "metricsToken": {"type": "http", "scheme": "bearer", "description": "ASYNCH_METRICS_TOKEN"},
            },
        },
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc
