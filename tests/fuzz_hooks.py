"""schemathesis hooks for tests/test_fuzz.py (loaded through SCHEMATHESIS_HOOKS).

The built-in ``positive_data_acceptance`` check refuses any 4xx on input the
schema calls valid.  A few of our rules cannot be written in a static JSON
Schema: they depend on stored rows (a model's own form, a model type that
must exist) or compare two fields (a window's from and to, a body's name and
the path's).  Rather than excuse whole operations, ``only_stateful_422``
excuses a 422 on schema-valid input only when every pointer it names is one
of those rules, declared below with its reason.  Any other 422 on
schema-valid input fails the run: the schema and the server disagree.

FUZZ_422_LOG, when set, names a file that receives one line per excused 422
(operation, pointers): the rules below are exactly the ones the fuzzer hits.
"""
from __future__ import annotations

import json
import os
import re

import schemathesis

# (operation label regex, pointer regex, why no static schema can say it)
STATEFUL_RULES: list[tuple[str, str, str]] = [
    (r"^POST (/v1/models/\{model\}/jobs|/jobs)$", r"^/(?!(modelKey|bizName|callbackUrl|webhookUrl|webhookEvents|Idempotency-Key|X-[A-Za-z-]+)$).*$",
     "the body is the payload, checked against the model's stored form (pointers name its fields)"),
    (r"^POST /task/createTask$", r"^/requestPayload(/.*)?$", "the payload must fit the model's stored form"),
    (r"^(POST /v1/models/\{model\}/jobs|POST /jobs|POST /task/createTask)$", r"^/Idempotency-Key$",
     "an idempotency key already used with another body"),
    (r"^(POST /v1/models/\{model\}/jobs|POST /jobs|POST /task/createTask)$", r"^/modelKey$",
     "the headers a job may set are the model's stored model_key_headers"),
    (r"^(POST /v1/models|(PUT|PATCH) /v1/models/\{name\}|POST /model/(createModel|updateModel)"
     r"|(POST /v1/model-types|(PUT|PATCH) /v1/model-types/\{type_id\}))$",
     r"^/form/\d+/pattern$", "a form pattern must be RE2 syntax (format: regex admits backreferences and lookaround)"),
    (r"^(POST /v1/models/\{model\}/jobs|POST /jobs|POST /task/createTask)$", r"^/callbackUrl$",
     "a callback host must resolve to an allowed address on an allowed port (DNS and the allow list, not syntax)"),
    (r"^POST (/v1/models/\{model\}/jobs|/jobs)$", r"^/webhookUrl$",
     "a webhook host must resolve to an allowed address on an allowed port (DNS and the allow list, not syntax)"),
    (r"^POST (/v1/models/\{model\}/jobs|/jobs)$", r"^/webhookEvents$",
     "X-Webhook-Events needs X-Webhook-Url (a rule across two headers)"),
    (r"^POST /v1/tenants/\{tenant\}/webhooks$", r"^/url$",
     "a webhook host must resolve to an allowed address on an allowed port, and a tenant holds at most 10 webhooks (stored count)"),
    (r"^(POST /v1/models|(PUT|PATCH) /v1/models/\{name\}|POST /model/(createModel|updateModel))$",
     r"^/(models_type|modelsType)$", "the model type must exist"),
    (r"^(POST /v1/models|(PUT|PATCH) /v1/models/\{name\}|POST /model/(createModel|updateModel)"
     r"|(POST /v1/model-types|(PUT|PATCH) /v1/model-types/\{type_id\}))$",
     r"^/form/\d+/field$", "form field names are unique within a form (a rule over items' keys)"),
    (r"^(PUT|PATCH) /v1/models/\{name\}$", r"^/model_name$", "a body's model_name must be the path's"),
    (r"^(PUT|PATCH) /v1/model-types/\{type_id\}$", r"^/type_id$", "a body's type_id must be the path's"),
    (r"^POST (/v1/models/\{model\}/jobs|/jobs)$", r"^/X-Payload-File$",
     "a payload by reference must name a stored file of the caller's tenant, and the body then be {}"),
    (r"^POST /v1/batches$", r"^/input_file_id$", "the input file must be a stored file of purpose batch"),
    (r"^GET (/v1/jobs|/v1/models/\{model\}/jobs)$", r"^/cursor$", "a cursor must name a job of the listing"),
    (r"^GET (/v1/stats|/stat/getModelStat)$", r"^/cursor$", "a cursor must be a next_cursor of the listing"),
    (r"^GET (/v1/jobs|/v1/models/\{model\}/jobs|/v1/stats|/stat/getModelStat)$",
     r"^/(from|to|since|until|startTime|endTime)$", "a window's start must not be after its end"),
]
_RULES = [(re.compile(op), re.compile(ptr)) for op, ptr, _ in STATEFUL_RULES]

# (error message regex, why) -- rules that hold for every string of every body,
# wherever it sits.  The schema states them for declared fields; free-form
# values (extra keys of a form field, ignored read-only keys, a payload) are
# "any JSON", and JSON Schema cannot constrain every string of "any JSON".
BODY_RULES: list[tuple[str, str]] = [
    (r"^must not contain NUL characters$", "PostgreSQL text and jsonb cannot hold U+0000"),
]
_BODY_RULES = [re.compile(msg) for msg, _ in BODY_RULES]


def _errors(response) -> list[tuple[str | None, str | None]] | None:
    try:
        body = json.loads(response.content or b"{}")
    except ValueError:
        return None
    errors = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(errors, list) or not errors:
        return None
    return [(e.get("pointer"), e.get("message")) if isinstance(e, dict) else (None, None) for e in errors]


def _declared(label: str, pointer: str | None, message: str | None) -> bool:
    if isinstance(message, str) and any(rule.search(message) for rule in _BODY_RULES):
        return True
    return isinstance(pointer, str) and any(op.search(label) and ptr.search(pointer) for op, ptr in _RULES)


@schemathesis.check
def only_stateful_422(ctx, response, case):
    """A 422 on positive (schema-valid) data names only declared stateful rules."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return None
    label = f"{case.method.upper()} {case.operation.path}"
    errors = _errors(response)
    excused = errors is not None and all(_declared(label, p, m) for p, m in errors)
    if not excused:
        raise AssertionError(f"422 on schema-valid input names no stateful rule: {label} -> "
                             f"{response.content[:500]!r}")
    log = os.environ.get("FUZZ_422_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(f"{label}\t{json.dumps([p for p, _ in errors])}\n")
    return None
