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

from app.catalog.registry import BASE_URL_PATTERN, ROUTE_PATTERN
from app.states import _V1_NAMES

V1_STATES = sorted(set(_V1_NAMES.values()))

_S = "#/components/schemas/"
_R = "#/components/responses/"


def ref(name: str) -> dict:
    return {"$ref": _S + name}


class Setting:
    """A bound that is a setting (e.g. the largest timeout_seconds): filled
    in by document() so the document says what this deployment enforces."""

    def __init__(self, name: str):
        self.name = name


def _fill(node, settings):
    if isinstance(node, Setting):
        return getattr(settings, node.name)
    if isinstance(node, dict):
        return {k: _fill(v, settings) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, settings) for v in node]
    return node


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
# The seed-002 face answers the same statuses in its envelope
# {"code": <status>, "message": <error text>, "data": null[, "errors"]}.
SEED_RESPONSES: dict[str, dict] = {
    "Seed" + name: {**resp, "content": {"application/json": {"schema": ref(
        "SeedValidationError" if name == "Invalid" else "SeedError")}}}
    for name, resp in RESPONSES.items()
}
RESPONSES.update(SEED_RESPONSES)

_CODE_TO_RESPONSE = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                     405: "MethodNotAllowed", 409: "Conflict", 410: "Gone", 413: "TooLarge",
                     422: "Invalid", 429: "QueueFull", 503: "Unavailable"}

_ISO = {"type": "string", "format": "date-time"}
_ISO_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
_POINTER_ERRORS = {"type": "array", "items": {
    "type": "object", "required": ["pointer", "message"],
    "properties": {"pointer": {"type": "string"}, "message": {"type": "string"}}}}

_NO_NUL = "^[^\\x00]*$"
_TEXT = {"type": "string", "pattern": _NO_NUL}
_HEADER_PART = r"\s*(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+\s*:[^,\x00-\x08\x0a-\x1f\x7f]*)?"
_HEADER_SPEC = {"type": ["string", "null"], "pattern": f"^{_HEADER_PART}(?:,{_HEADER_PART})*$",
                "description": "K:V,K2:V2 headers: names are HTTP tokens, values have no control characters "
                               "(CR, LF, NUL refused); secret, shown back as K:***"}


def _int(lo: int, hi, description: str = "") -> dict:
    out = {"type": "integer", "minimum": lo, "maximum": hi}
    if description:
        out["description"] = description
    return out


# What a model write accepts (v1 names; the seed face uses their camelCase).
_MODEL_INPUT_FIELDS: dict[str, dict] = {
    "model_name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"},
    "models_type": {"type": ["string", "null"], "pattern": "^(?:\\s*[0-9]+(?:\\s*,\\s*[0-9]+)*\\s*)?$",
                    "maxLength": 512,
                    "description": "comma list of model type ids that exist, e.g. 1,2 (unknown ids: 422)"},
    "form": {"type": ["array", "null"], "items": ref("FormField"),
             "description": "field names must be unique (a duplicate: 422)"},
    "base_url": {"type": "string", "pattern": f"^{BASE_URL_PATTERN}$", "maxLength": 1024},
    "route": {"type": ["string", "null"], "pattern": f"^(?:{ROUTE_PATTERN})?$", "maxLength": 1024},
    "http_method": {"type": "string", "pattern": "^(?:[Gg][Ee][Tt]|[Pp][Oo][Ss][Tt])$",
                    "description": "GET or POST (any case)"},
    "head_msg": _HEADER_SPEC,
    "enabled": {"anyOf": [{"type": "boolean"}, {"type": "integer", "enum": [0, 1]}]},
    "max_concurrency": _int(1, 10_000, "per tenant: calls at once"),
    "queue_limit": _int(0, 1_000_000, "pending + running jobs; 0 rejects all"),
    "timeout_seconds": _int(1, Setting("max_model_timeout_seconds"), "one model call"),
    "expected_seconds": _int(1, 7 * 86400),
    "retry_times": _int(0, 100, "retries after the first try"),
    "retry_queue_max_seconds": _int(0, 7 * 86400),
    "auto_clean_seconds": _int(0, 365 * 86400, "retention after a batch claim"),
    "remark": {"type": ["string", "null"], "maxLength": 4000, "pattern": _NO_NUL},
    "created_at": {"description": "read-only: ignored, so a model view can be sent back"},
    "updated_at": {"description": "read-only: ignored, so a model view can be sent back"},
}

# A model as shown.
_MODEL_FIELDS: dict[str, dict] = {
    "model_name": {"type": "string"},
    "models_type": {"type": "string", "description": "comma list of model type ids, e.g. 1,2"},
    "form": {"type": ["array", "null"], "items": ref("FormField")},
    "base_url": {"type": "string"},
    "route": {"type": "string"},
    "http_method": {"type": "string", "enum": ["GET", "POST"]},
    "head_msg": {"type": "string", "description": "header names only: K:***,K2:***"},
    "enabled": {"type": "boolean"},
    "max_concurrency": {"type": "integer"},
    "queue_limit": {"type": "integer"},
    "timeout_seconds": {"type": "integer"},
    "expected_seconds": {"type": "integer"},
    "retry_times": {"type": "integer"},
    "retry_queue_max_seconds": {"type": "integer"},
    "auto_clean_seconds": {"type": "integer"},
    "remark": {"type": "string"},
    "created_at": _ISO_OR_NULL,
    "updated_at": _ISO_OR_NULL,
}

_CAMEL = {"model_name": "modelName", "models_type": "modelsType", "base_url": "baseUrl",
          "http_method": "httpMethod", "head_msg": "headMsg", "max_concurrency": "maxConcurrency",
          "queue_limit": "queueLimit", "timeout_seconds": "timeoutSeconds", "expected_seconds": "expectedSeconds",
          "retry_times": "retryTimes", "retry_queue_max_seconds": "retryQueueMaxSeconds",
          "auto_clean_seconds": "autoCleanSeconds", "created_at": "createdAt", "updated_at": "updatedAt",
          "type_id": "typeId", "type_name": "typeName"}


def _camel(props: dict) -> dict:
    return {_CAMEL.get(k, k): v for k, v in props.items()}


_SEED_MODEL_FIELDS = {**_camel(_MODEL_FIELDS), "enabled": {"type": "integer", "enum": [0, 1]}}
_MODEL_TYPE_FIELDS = {"type_id": {"type": "integer"}, "type_name": {"type": "string"},
                      "remark": {"type": "string"}, "created_at": _ISO_OR_NULL}
_MODEL_TYPE_INPUT = {
    "type_id": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1,
                "description": "absent: the next free id"},
    "type_name": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[^\\x00-\\x1f]*[^\\x00-\\x1f\\s][^\\x00-\\x1f]*$",
                  "description": "not blank, no control characters"},
    "remark": {"type": ["string", "null"], "maxLength": 4000, "pattern": _NO_NUL},
}
_TASK_ID = {"type": "string", "minLength": 1, "maxLength": 40, "pattern": _NO_NUL}
_TENANT_ID = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"}
_DAY = {"anyOf": [{"type": "string", "format": "date"}, {"const": ""}], "description": "YYYY-MM-DD (empty: none)"}

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
    "FormField": {
        "type": "object", "required": ["field"],
        "description": "one field of a model's form; fields not in the form pass through to the model",
        "properties": {
            "field": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"},
            "label": {"type": "string"},
            "type": {"type": "string", "default": "string",
                     "enum": ["string", "text", "number", "integer", "boolean", "select", "array", "object",
                              "url", "image"]},
            "required": {"type": "boolean"},
            "options": {"type": ["array", "null"], "description": "the value must be one of them (a select needs some)"},
            "minLength": {"type": "integer", "minimum": 0}, "maxLength": {"type": "integer", "minimum": 0},
            "min": {"type": "number"}, "max": {"type": "number"},
            "pattern": {"type": "string", "format": "regex"}},
        "if": {"required": ["type"], "properties": {"type": {"const": "select"}}},
        "then": {"required": ["options"], "properties": {"options": {"type": "array", "minItems": 1}}}},
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
              "properties": _MODEL_FIELDS},
    "ModelInput": {"type": "object", "required": ["model_name", "base_url"], "additionalProperties": False,
                   "properties": _MODEL_INPUT_FIELDS},
    "ModelPatch": {"type": "object", "additionalProperties": False, "properties": _MODEL_INPUT_FIELDS,
                   "description": "model_name, if given, must be the model's own name"},
    "ModelList": {"type": "object", "required": ["models"], "properties": {
        "models": {"type": "array", "items": ref("Model")}}},
    "ApiKey": {"type": "object", "required": ["id", "tenant", "role", "name", "prefix", "created_at", "revoked_at"],
               "properties": {"id": {"type": "integer"}, "tenant": {"type": "string"},
                              "role": {"type": "string", "enum": ["admin", "user"]}, "name": {"type": "string"},
                              "prefix": {"type": "string"}, "created_at": _ISO, "revoked_at": _ISO_OR_NULL}},
    "ApiKeyCreated": {"allOf": [ref("ApiKey"), {"type": "object", "required": ["key"], "properties": {
        "key": {"type": "string", "description": "the key itself, shown once"}}}]},
    "ApiKeyInput": {"type": "object", "required": ["tenant"], "properties": {
        "tenant": _TENANT_ID, "role": {"type": "string", "enum": ["admin", "user"], "default": "user"},
        "admin": {"type": ["boolean", "null"], "description": "true: the same as role admin"},
        "name": {"type": "string", "maxLength": 128, "pattern": _NO_NUL}}},
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
    # --- the seed-002 face ---
    "SeedError": {"type": "object", "required": ["code", "message", "data"], "description":
                  "an error on the seed face: code is the HTTP status, message the error text", "properties": {
                      "code": {"type": "integer", "minimum": 400}, "message": {"type": "string"},
                      "data": {"type": "null"}}},
    "SeedValidationError": {"allOf": [ref("SeedError"), {"type": "object", "required": ["errors"], "properties": {
        "errors": {**_POINTER_ERRORS, "description": "camelCase pointers: /modelsType, /requestPayload/prompt"}}}]},
    "SeedModel": {"type": "object", "required": ["modelName"], "description":
                  "admins see every field; other keys see modelName, modelsType, form, enabled, "
                  "expectedSeconds, timeoutSeconds, queueLimit, maxConcurrency, remark",
                  "properties": _SEED_MODEL_FIELDS},
    "SeedModelInput": {"type": "object", "required": ["modelName", "baseUrl"], "additionalProperties": False,
                       "properties": _camel(_MODEL_INPUT_FIELDS)},
    "SeedModelPatch": {"type": "object", "required": ["modelName"], "additionalProperties": False,
                       "properties": _camel(_MODEL_INPUT_FIELDS),
                       "description": "modelName names the model; the other fields given change"},
    "SeedModelType": {"type": "object", "required": ["typeId", "typeName", "remark", "createdAt"],
                      "properties": _camel(_MODEL_TYPE_FIELDS)},
    "SeedModelTypeInput": {"type": "object", "required": ["typeName"], "additionalProperties": False,
                           "properties": _camel(_MODEL_TYPE_INPUT)},
    "SeedModelTypePatch": {"type": "object", "required": ["typeId"], "additionalProperties": False,
                           "properties": {**_camel(_MODEL_TYPE_INPUT),
                                          "typeId": {"type": "integer", "description": "the type to change"}}},
    "SeedTask": {"type": "object", "required": ["task_id", "state", "oss_file"], "description":
                 "state is the seed's code: 0 queued, 1 running, 2 done, 3 failed/timeout/canceled/waiting to "
                 "retry, 4 claimed; null for an unknown id (or another tenant's), which also has error "
                 "'task not found'", "properties": {
                     "task_id": {"type": "string"},
                     "state": {"type": ["integer", "null"], "enum": [0, 1, 2, 3, 4, None]},
                     "oss_file": {"type": ["string", "null"], "description": "where the result is (2 and 4)"},
                     "file_type": {"type": ["string", "null"], "description": "the result's MIME type"},
                     "expire_at": _ISO_OR_NULL, "model_name": {"type": "string"}, "biz_name": {"type": "string"},
                     "retry_count": {"type": "integer"}, "created_at": _ISO_OR_NULL, "finished_at": _ISO_OR_NULL,
                     "error": {"type": "string"},
                     "claimed": {"type": "boolean", "description": "getTaskBatch: this call moved it 2 -> 4"}}},
    "CreatedTask": {"type": "object", "required": ["task_id"], "properties": {
        "task_id": {"type": "string", "pattern": "^job_"}}},
    "TaskIds": {"type": "object", "required": ["taskIds"], "properties": {
        "taskIds": {"type": "array", "maxItems": Setting("batch_max_ids"), "items": _TASK_ID,
                    "description": "at most ASYNCH_BATCH_MAX_IDS; duplicates answered once"}}},
    "CreateTask": {"type": "object", "required": ["modelName"], "properties": {
        "modelName": {"type": "string", "minLength": 1},
        "requestPayload": {"anyOf": [{"type": "object"}, {"type": "string", "contentMediaType": "application/json",
                                                          "description": "a string holding a JSON object"}],
                           "description": "forwarded to the model; checked against the model's form "
                                          "(absent: {})"},
        "bizName": {"type": ["string", "null"], "maxLength": 128, "pattern": "^[^\\x00-\\x1f\\x7f]*$"},
        "callbackUrl": {"type": ["string", "null"], "maxLength": 2048,
                        "description": "http(s) to a public address (see docs/api.md, Callbacks)"},
        "modelKey": _HEADER_SPEC,
        "creator": {"type": ["string", "null"], "maxLength": 128, "pattern": "^[^\\x00-\\x1f\\x7f]*$"}}},
    # --- v1 business ---
    "ModelType": {"type": "object", "required": ["type_id", "type_name", "remark", "created_at"],
                  "properties": _MODEL_TYPE_FIELDS},
    "ModelTypeInput": {"type": "object", "required": ["type_name"], "additionalProperties": False,
                       "properties": _MODEL_TYPE_INPUT},
    "ModelTypePatch": {"type": "object", "additionalProperties": False, "properties": {
        **_MODEL_TYPE_INPUT, "type_id": {"type": ["integer", "null"], "description": "if given, the path's"}}},
    "ModelTypeList": {"type": "object", "required": ["model_types"], "properties": {
        "model_types": {"type": "array", "items": ref("ModelType")}}},
    "Usage": {"type": "object", "required": ["from", "to", "rows", "total"], "properties": {
        "from": {"type": ["string", "null"], "format": "date"}, "to": {"type": ["string", "null"], "format": "date"},
        "rows": {"type": "array", "items": {
            "type": "object", "required": ["day", "tenant_id", "creator", "model_name", "request_count"],
            "properties": {"day": {"type": "string", "format": "date"}, "tenant_id": {"type": "string"},
                           "creator": {"type": "string"}, "model_name": {"type": "string"},
                           "request_count": {"type": "integer", "minimum": 0}}}},
        "total": {"type": "integer", "minimum": 0}}},
    "CallbackDelivery": {"type": "object", "required": ["job_id", "url", "status", "attempts", "next_attempt_at",
                                                        "delivered_at", "last_error", "log"], "properties": {
        "job_id": {"type": "string"}, "url": {"type": "string"},
        "status": {"type": "string", "enum": ["pending", "sending", "delivered", "failed"]},
        "attempts": {"type": "integer"}, "next_attempt_at": _ISO_OR_NULL, "delivered_at": _ISO_OR_NULL,
        "last_error": {"type": ["string", "null"]},
        "log": {"type": "array", "items": {"type": "object", "required": [
            "attempt", "at", "duration_ms", "address", "http_status", "error"], "properties": {
            "attempt": {"type": "integer"}, "at": _ISO_OR_NULL, "duration_ms": {"type": ["integer", "null"]},
            "address": {"type": ["string", "null"]}, "http_status": {"type": ["integer", "null"]},
            "error": {"type": ["string", "null"]}}}}}},
    "TenantSecret": {"type": "object", "required": ["tenant", "secret", "created_at", "rotated_at"], "properties": {
        "tenant": {"type": "string"}, "secret": {"type": "string", "pattern": "^whsec_"},
        "created_at": _ISO, "rotated_at": _ISO_OR_NULL}},
    # --- maintenance ---
    "Report": {"type": "object", "required": ["processed"], "additionalProperties": True,
               "description": "rows or items the pass worked on, with a report per part (docs/api.md)",
               "properties": {"processed": {"type": "integer", "minimum": 0}}},
    "AutotuneReport": {"type": "object", "required": ["processed", "window_seconds", "dry_run", "models", "busy"],
                       "properties": {
        "processed": {"type": "integer", "minimum": 0, "description": "models whose limits changed"},
        "window_seconds": {"type": "integer"}, "dry_run": {"type": "boolean"},
        "models": {"type": "array", "items": {"type": "object", "required": [
            "model", "action", "reason", "old", "new", "inputs", "evidence_seconds", "applied", "changed"],
            "properties": {
                "model": {"type": "string"}, "action": {"type": "string",
                                                        "enum": ["skip", "decrease", "increase", "hold"]},
                "reason": {"type": "string"}, "old": ref("Limits"),
                "new": {"anyOf": [ref("Limits"), {"type": "null"}]},
                "inputs": {"type": "object", "required": ["samples", "p90_seconds", "throughput_per_second",
                                                          "queued"]},
                "evidence_seconds": {"type": "number"}, "applied": {"type": "boolean"},
                "changed": {"type": "boolean"}}}},
        "busy": {"type": "array", "items": {"type": "string"},
                 "description": "models another run was tuning at that moment"}}},
    "Limits": {"type": "object", "required": ["max_concurrency", "queue_limit"], "properties": {
        "max_concurrency": {"type": "integer"}, "queue_limit": {"type": "integer"}}},
    "BeatRuns": {"type": "object", "required": ["runs"], "properties": {"runs": {"type": "array", "items": {
        "type": "object", "required": ["task", "ran_at", "took", "processed"], "properties": {
            "task": {"type": "string"}, "ran_at": {"type": "number", "description": "unix time"},
            "took": {"type": "number"}, "processed": {"type": ["integer", "null"]},
            "owner": {"type": ["string", "null"]}, "token": {"type": ["integer", "null"]},
            "sent_at": {"type": ["number", "null"]}}}}}},
}


def _seed_ok(data: dict, description: str) -> dict:
    """The seed face's success envelope around ``data``."""
    return _json({"type": "object", "required": ["code", "message", "data"], "properties": {
        "code": {"const": 0}, "message": {"const": "ok"}, "data": data}}, description)

BEARER = [{"bearerAuth": []}]
NO_AUTH: list = []


def op(summary: str, ok: dict[int, dict], errors: tuple[int, ...] = (), *, tag: str,
       params: list | None = None, body: dict | None = None, auth: list | None = None,
       path_params: bool = False, description: str | None = None, face: str = "v1",
       body_required: bool = True, admin: bool = False) -> dict:
    """One operation.  ``ok`` maps success codes to response objects; error
    codes become $refs to the shared responses, plus those implied by
    authentication (401, and 503 when the key lookup cannot reach the
    database), an admin-only route (403), path parameters (404), query
    parameters (422) and a body (400, 413).  ``face="seed"``: the errors come in the seed's envelope."""
    security = BEARER if auth is None else auth
    codes = set(errors)
    if security == BEARER:
        codes |= {401, 503}
    if admin:
        codes.add(403)
        summary += " (admin)" if "admin" not in summary else ""
    if path_params:
        codes.add(404)
    if body is not None:
        codes |= {400, 413}
    if any(p["in"] == "query" for p in params or ()):
        codes.add(422)  # at least a NUL in a value
    prefix = "Seed" if face == "seed" else ""
    out: dict[str, Any] = {"summary": summary, "tags": [tag], "security": security,
                           "responses": {str(c): r for c, r in sorted(ok.items())}}
    for c in sorted(codes):
        out["responses"][str(c)] = {"$ref": _R + prefix + _CODE_TO_RESPONSE[c]}
    if admin:
        out["x-admin-only"] = True
    if description:
        out["description"] = description
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = {"required": body_required, "content": {"application/json": {"schema": body}}}
    return out


def path_param(name: str, schema: dict | None = None, description: str = "") -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema or {"type": "string"},
            "description": description}


def query(name: str, schema: dict, description: str = "", required: bool = False) -> dict:
    return {"name": name, "in": "query", "required": required, "schema": schema, "description": description}


def header(name: str, description: str) -> dict:
    return {"name": name, "in": "header", "required": False, "schema": {"type": "string"},
            "description": description}


_ISO_QUERY = {"anyOf": [{"type": "string", "format": "date-time"}, {"const": ""}]}
_MODEL = path_param("model", description="model_name")
_JOB = path_param("job_id", description="job id (job_...)")
_LIST_QUERY = [
    query("state", {"type": "string", "enum": V1_STATES}),
    query("limit", {"type": "integer", "minimum": 1, "maximum": Setting("list_max_limit"), "default": 50}),
    query("cursor", _TEXT, "next_cursor of the previous page"),
    query("tenant", _TEXT, "admins: only this tenant's jobs"),
    query("since", _ISO_QUERY, "only jobs created at or after this time (ISO 8601; no offset: UTC)"),
    query("until", _ISO_QUERY, "only jobs created before this time (ISO 8601; no offset: UTC)"),
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
        "post": op("Create a model (admin)", {201: _json(ref("Model"), "created")}, (409, 422),
                   tag="models", body=ref("ModelInput"), admin=True),
    },
    "/v1/models/{name}": {
        "parameters": [path_param("name", description="model_name")],
        "get": op("A model", {200: _json(ref("Model"), "the model")}, tag="models", path_params=True),
        "put": op("Update a model (admin; only the fields given change)", {200: _json(ref("Model"), "updated")},
                  (422,), tag="models", path_params=True, body=ref("ModelPatch"), admin=True),
        "patch": op("Update a model (admin; only the fields given change)", {200: _json(ref("Model"), "updated")},
                    (422,), tag="models", path_params=True, body=ref("ModelPatch"), admin=True),
        "delete": op("Delete a model (admin; 409 while it has active jobs)", {204: {"description": "deleted"}},
                     (409,), tag="models", path_params=True, admin=True),
    },
    "/v1/keys": {
        "get": op("List API keys (admin; never the secrets)", {200: _json(ref("ApiKeyList"), "keys")},
                  tag="keys", params=[query("tenant", _TEXT)], admin=True),
        "post": op("Create an API key (admin); the key is shown once",
                   {201: _json(ref("ApiKeyCreated"), "created")}, (422,), tag="keys", body=ref("ApiKeyInput"),
                   admin=True),
    },
    "/v1/keys/{key_id}": {
        "parameters": [path_param("key_id", {"type": "integer"})],
        "delete": op("Revoke an API key (admin)", {200: _json(ref("ApiKey"), "revoked")},
                     tag="keys", path_params=True, admin=True),
    },
}

_SEED = {"face": "seed", "tag": "seed"}
_SEED_TASK_HEADERS = [header("Idempotency-Key", "1-255 printable ASCII; the same key returns the first task"),
                      header("X-Creator", "who submitted it (stats), when the body has no creator"),
                      header("X-Oss-Authorization", "sent as Authorization to the OSS file service"),
                      header("X-User-Info", "passed to the OSS file service; the creator behind a trusted gateway")]
_STATS_QUERY = [query("from", _DAY, "first day (inclusive)"), query("to", _DAY, "last day (inclusive)"),
                query("tenant", _TEXT, "users: only their own (another: 403)"),
                query("model", _TEXT)]
_OPTIONAL_BODY = {"type": "object", "description": "optional; ignored"}

PATHS["seed"] = {
    "/model/createModel": {"post": op(
        "Create a model", {200: _seed_ok(ref("SeedModel"), "the model")}, (409, 422), body=ref("SeedModelInput"),
        admin=True, **_SEED)},
    "/model/updateModel": {"post": op(
        "Update a model: modelName names it, the other fields given change",
        {200: _seed_ok(ref("SeedModel"), "the model")}, (404, 422), body=ref("SeedModelPatch"), admin=True, **_SEED)},
    "/model/getModel": {"get": op(
        "A model (users: enabled ones, fewer fields)", {200: _seed_ok(ref("SeedModel"), "the model")}, (404, 422),
        params=[query("modelName", {**_TEXT, "minLength": 1}, required=True)], **_SEED)},
    "/model/listModel": {"get": op(
        "Models (users: enabled ones, fewer fields)",
        {200: _seed_ok({"type": "array", "items": ref("SeedModel")}, "the models")}, **_SEED)},
    "/model/deleteModel": {"post": op(
        "Delete a model (409 while it has active tasks)",
        {200: _seed_ok({"type": "object", "required": ["modelName"], "properties": {
            "modelName": {"type": "string"}}}, "deleted")}, (404, 409, 422),
        body={"type": "object", "required": ["modelName"], "properties": {
            "modelName": {**_TEXT, "minLength": 1}}}, admin=True, **_SEED)},
    "/modelType/create": {"post": op(
        "Create a model type (without typeId: the next free id)", {200: _seed_ok(ref("SeedModelType"), "the type")},
        (409, 422), body=ref("SeedModelTypeInput"), admin=True, **_SEED)},
    "/modelType/update": {"post": op(
        "Update a model type", {200: _seed_ok(ref("SeedModelType"), "the type")}, (404, 422),
        body=ref("SeedModelTypePatch"), admin=True, **_SEED)},
    "/modelType/list": {"get": op(
        "Model types", {200: _seed_ok({"type": "array", "items": ref("SeedModelType")}, "the types")}, **_SEED)},
    "/modelType/delete": {"post": op(
        "Delete a model type (409 while a model's modelsType names it)",
        {200: _seed_ok({"type": "object", "required": ["typeId"], "properties": {"typeId": {"type": "integer"}}},
                       "deleted")}, (404, 409, 422),
        body={"type": "object", "required": ["typeId"], "properties": {"typeId": {"type": "integer"}}},
        admin=True, **_SEED)},
    "/task/createTask": {"post": op(
        "Submit a task (the v1 submit with the seed's fields)", {200: _seed_ok(ref("CreatedTask"), "admitted")},
        (404, 422, 429), body=ref("CreateTask"), params=_SEED_TASK_HEADERS, **_SEED,
        description="404: unknown or disabled model; 422: bad fields or the model's form (pointers under "
                    "/requestPayload), a reused Idempotency-Key with another body; 429: the queue is full.")},
    "/task/getTaskBatch": {"post": op(
        "Tasks by id; done ones are claimed (2 -> 4, expire_at set) by exactly one call",
        {200: _seed_ok({"type": "array", "items": ref("SeedTask")}, "one entry per distinct id, in order")},
        (422,), body=ref("TaskIds"), **_SEED,
        description="Unknown ids and other tenants' ids are answered as not found and never touched.")},
    "/task/getTaskResult": {"get": op(
        "One task (another tenant's: 404)", {200: _seed_ok(ref("SeedTask"), "the task")}, (404, 422),
        params=[query("taskId", {**_TEXT, "minLength": 1}, required=True)], **_SEED)},
    "/stat/getModelStat": {"get": op(
        "Usage counts (as /v1/stats)", {200: _seed_ok(ref("Usage"), "counts")}, (403, 422), params=_STATS_QUERY,
        **_SEED)},
}

PATHS["seed_maintenance"] = {
    "/task/runWork": {"post": op(
        "Run the retry pass now (as POST /v1/maintenance/retry)", {200: _seed_ok(ref("Report"), "its report")},
        body=_OPTIONAL_BODY, body_required=False, admin=True, **_SEED)},
    "/task/cleanWork": {"post": op(
        "Run cleanup, then recovery, now", {200: _seed_ok(ref("Report"), "{cleanup: {...}, recover: {...}}")},
        body=_OPTIONAL_BODY, body_required=False, admin=True, **_SEED)},
    "/model/autoTune": {"post": op(
        "Run autotune now", {200: _seed_ok(ref("AutotuneReport"), "the decisions")}, (422,),
        body={"type": "object", "properties": {
            "windowSeconds": {"type": ["integer", "null"], "maximum": 30 * 86400,
                              "description": "absent or <= 0: ASYNCH_AUTOTUNE_WINDOW_SECONDS"},
            "dryRun": {"type": "boolean", "description": "decide, write nothing"}}},
        body_required=False, admin=True, **_SEED)},
}

_TYPE_ID = path_param("type_id", {"type": "integer", "minimum": 0})
_TENANT = path_param("tenant", _TENANT_ID, "tenant id")

PATHS["v1_business"] = {
    "/v1/stats": {"get": op(
        "Usage: one count per model call, by day, tenant, creator and model", {200: _json(ref("Usage"), "counts")},
        (403, 422), tag="stats", params=_STATS_QUERY,
        description="Users see their own tenant; another tenant is 403. Bad dates or from after to: 422.")},
    "/v1/model-types": {
        "get": op("Model types", {200: _json(ref("ModelTypeList"), "the types")}, tag="models"),
        "post": op("Create a model type (without type_id: the next free id)",
                   {201: _json(ref("ModelType"), "created")}, (409, 422), tag="models", body=ref("ModelTypeInput"),
                   admin=True),
    },
    "/v1/model-types/{type_id}": {
        "parameters": [_TYPE_ID],
        "put": op("Update a model type (only the fields given change)", {200: _json(ref("ModelType"), "updated")},
                  (422,), tag="models", path_params=True, body=ref("ModelTypePatch"), admin=True),
        "patch": op("Update a model type (only the fields given change)", {200: _json(ref("ModelType"), "updated")},
                    (422,), tag="models", path_params=True, body=ref("ModelTypePatch"), admin=True),
        "delete": op("Delete a model type (409 while a model's models_type names it)",
                     {204: {"description": "deleted"}}, (409,), tag="models", path_params=True, admin=True),
    },
    "/v1/jobs/{job_id}/callback": {
        "parameters": [_JOB],
        "get": op("A job's callback and its delivery log", {200: _json(ref("CallbackDelivery"), "the callback")},
                  tag="callbacks", path_params=True,
                  description="404 for unknown jobs, other tenants' jobs and jobs without a callback."),
    },
    "/v1/tenants/{tenant}/callback-secret": {
        "parameters": [_TENANT],
        "get": op("A tenant's callback signing secret (created on first use)",
                  {200: _json(ref("TenantSecret"), "the secret")}, (403, 422), tag="callbacks", path_params=True,
                  description="A user key only for its own tenant (else 403); 422: not a tenant id."),
    },
    "/v1/tenants/{tenant}/callback-secret/rotate": {
        "parameters": [_TENANT],
        "post": op("Rotate a tenant's callback signing secret", {200: _json(ref("TenantSecret"), "the new secret")},
                   (422,), tag="callbacks", path_params=True, admin=True),
    },
}

_PASS = {"retry": "due retries re-admitted, long-waiting retries promoted, lost messages re-sent",
         "recover": "wiped Redis repaired, expired leases, overdue jobs, lost messages, gates, permits",
         "cleanup": "expired claimed jobs and old terminal jobs deleted with their results; overdue jobs timed out",
         "reconcile": "gate slot sets made equal to the pending/running rows"}

PATHS["v1_maintenance"] = {
    **{f"/v1/maintenance/{name}": {"post": op(
        f"Run the {name} pass now: {what}", {200: _json(ref("Report"), "its report")}, tag="maintenance",
        admin=True)} for name, what in _PASS.items()},
    "/v1/maintenance/autotune": {"post": op(
        "Run autotune now", {200: _json(ref("AutotuneReport"), "the decisions")}, (422,), tag="maintenance",
        body={"type": "object", "properties": {
            "window_seconds": {"type": ["integer", "null"], "maximum": 30 * 86400,
                               "description": "absent or <= 0: ASYNCH_AUTOTUNE_WINDOW_SECONDS"},
            "dry_run": {"type": "boolean", "description": "decide, write nothing"}}},
        body_required=False, admin=True)},
    "/v1/maintenance/runs": {"get": op(
        "The last periodic runs beat got done", {200: _json(ref("BeatRuns"), "newest last")}, (422,),
        tag="maintenance", params=[query("limit", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100})],
        admin=True)},
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
        "This API server's counters and histograms (Prometheus text format)",
        {200: {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
         401: {"$ref": _R + "Unauthorized"}},
        tag="meta", auth=[{}, {"metricsToken": []}],
        description="No API key. When ASYNCH_METRICS_TOKEN is set, send it as `Authorization: Bearer <token>` "
                    "(401 otherwise). Counters and histograms of the gunicorn processes of the server that "
                    "answers (not the cluster's): scrape every API pod and sum in PromQL. Worker nodes serve "
                    "theirs on ASYNCH_WORKER_METRICS_PORT.")},
    "/metrics/cluster": {"get": op(
        "The cluster's gauges (Prometheus text format)",
        {200: {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
         401: {"$ref": _R + "Unauthorized"}},
        tag="meta", auth=[{}, {"metricsToken": []}],
        description="No API key; ASYNCH_METRICS_TOKEN as for /metrics. Jobs by model and state, the oldest "
                    "pending job's age, gate depth and limits, running vs concurrency, runtime overrides, "
                    "worker liveness: read from PostgreSQL and Redis at scrape time, the same on every API "
                    "pod, so scrape it once per cluster (through the Service), not per pod. "
                    "`asynch_metrics_source_up` says which source answered.")},
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
                                "422 adds `errors: [{pointer, message}]` (the seed-002 routes answer in their "
                                "envelope `{code, message, data: null[, errors]}`). A method a path does not "
                                "list answers 405 with `Allow`. No string may hold NUL (U+0000): in a path "
                                "that is 404, in a query value or a JSON body 422 (a job's payload may: "
                                "it is data for the model); unpaired surrogates in a JSON body are 400. JSON numbers with no fraction (2.0) are integers."},
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
    from app.config import get_settings

    return _fill(doc, get_settings())  # a fresh copy with the settings' bounds
