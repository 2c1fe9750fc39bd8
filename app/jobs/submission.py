"""The submission rule: what makes a job's options and payload admissible,
for every face that submits (v1 single, v1 batch, seed createTask).

Invariants:
- One declared option set (``SubmitOptions``): every option's type, rule and
  default is written here once.  A face's shape (app/jobs/requests.py,
  app/jobs/seed_schemas.py) only says how its wire spells an option and
  carries it under the option's own field name; ``given`` reads them off by
  that name, so no face maps options by hand.
- One function (``check``) judges a submission, in one order: the options,
  the callback and webhook targets (SSRF guard), the model (404), the
  modelKey against what it allows, the payload against its form; anything
  else is a DomainError before the gate: bad input takes no slot, writes no row.
- A 422 names the face's own pointers (``Face``): v1 and seed name an option
  by its camelCase name (the key: ``/Idempotency-Key``), a batch item by its
  field under ``/jobs/{index}``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from app.catalog.forms import validate_payload
from app.catalog.registry import enabled_model
from app.contract import Int, Shape, pattern, pointer_errors, rule
from app.errors import BadRequest, ValidationFailed
from app.infra import secretbox
from app.infra.http.headers import HEADER_SPEC_PATTERN, HEADER_SPEC_TEXT, override_problem, parse_header_spec
from app.infra.http.netguard import Lookups, callback_url_problem
from app.jobs import references

_NO_CONTROL = "^[^\\x00-\\x1f\\x7f]*$"
HEADER_SPEC_HELP = ("K:V,K2:V2 headers for this job only (secret): names are HTTP tokens, values have no "
                    "control characters")

IdempotencyKey = Annotated[str, pattern("^[\\x20-\\x7e]{1,255}$", "1-255 printable ASCII characters")]
BizName = Creator = Annotated[str, Field(max_length=128), pattern(_NO_CONTROL, "text without control characters")]
CallbackUrl = Annotated[str, Field(max_length=2048, description="http(s) to a public address (docs/api.md, Callbacks)")]
# Values passed on to the OSS file service as headers.
HeaderValue = Annotated[str, Field(max_length=8192), pattern("^[^\\r\\n\\x00]*$", "text without CR, LF or NUL")]
ModelKey = Annotated[str, pattern(HEADER_SPEC_PATTERN, HEADER_SPEC_TEXT)] | None

WebhookEvent = Literal["done", "failed", "timeout", "canceled"]
_EVENT = "(done|failed|timeout|canceled)"
WEBHOOK_EVENTS_PATTERN = f"^( *{_EVENT} *(, *{_EVENT} *)*)?$"
WEBHOOK_EVENTS_HELP = "comma-separated terminal states to POST the webhook on: done, failed, timeout, canceled (default all)"
WebhookEvents = Annotated[list[WebhookEvent], Field(min_length=1)]
Priority = Int(0, 9)  # a JSON integer: true and "7" are not (a header's text is read by its face)
DEADLINE_HELP = ("seconds from now (0 < s <= 2592000) by which the job must be done: refused at submit (429 "
                 "deadline_unmeetable) when the queue estimate ends later; still pending past it, it ends expired")


PAYLOAD_FILE_HELP = ("an uploaded file of yours (POST /v1/files) whose bytes are the payload, streamed to the model "
                     "as its JSON body; the body must then be {} and the model's form is not applied")


def json_number(v: Any) -> Any:
    """A JSON number as JSON has it: true is not 1 and "5" is not 5 (pydantic's lax float takes both;
    a header's text is turned into a number by its face, app/jobs/requests.py)."""
    if isinstance(v, (bool, str)):
        raise PydanticCustomError("float_type", "must be a number")
    return v


DeadlineSeconds = Annotated[float, Field(gt=0, le=30 * 86400, allow_inf_nan=False), BeforeValidator(json_number)]


def carried(option_type: Any, wire_type: Any) -> Any:
    """A face's field for an option the rule judges: taken as ``wire_type``,
    documented as ``option_type`` (the rule the 422 will come from)."""
    return Annotated[wire_type, WithJsonSchema(TypeAdapter(option_type).json_schema())]


# Every face sends "" (or null) for "no URL" / "the default".
def _none_if_empty(v: Any) -> Any:
    return None if v == "" else v


class SubmitOptions(Shape):
    """What a job carries besides its payload: the one declaration of every
    option (constructed by field name)."""
    invalid: ClassVar[str] = "invalid job options"
    model_config = ConfigDict(frozen=True)

    idempotency_key: IdempotencyKey | None = Field(
        None, description="1-255 printable ASCII; the same key returns the first job")
    creator: Creator = Field("", description="who submitted it (stats)")
    biz_name: BizName = Field("", description="business name (callbacks)")
    callback_url: Annotated[CallbackUrl | None, BeforeValidator(_none_if_empty)] = Field(
        None, description="GET on done (see docs/api.md, Callbacks)")
    model_key: ModelKey = Field(None, description=HEADER_SPEC_HELP)
    # Headers for the OSS file service ({"Authorization": ..., "X-User-Info": ...});
    # secrets, kept only until the job is terminal.  Not a wire field: the
    # faces build it from X-Oss-Authorization / X-User-Info.
    passthrough: dict[str, HeaderValue] | None = None
    priority: Annotated[Priority, BeforeValidator(lambda v: 5 if _none_if_empty(v) is None else v)] = rule(
        "from 0 to 9 (9 first; default 5)", 5)
    # The job's own webhook (docs/api.md, Webhooks): a signed JSON POST on
    # each terminal state of ``webhook_events`` (default: all four).
    webhook_url: Annotated[CallbackUrl | None, BeforeValidator(_none_if_empty)] = Field(
        None, description="a signed JSON POST (Standard Webhooks) on the job's terminal state "
                          "(see docs/api.md, Webhooks)")
    webhook_events: WebhookEvents | None = Field(None, description=WEBHOOK_EVENTS_HELP)
    # The caller's deadline (docs/api.md, Deadlines): judged against the
    # queue's estimate at admission (app/jobs/estimates.py), kept as
    # caller_deadline_at.
    deadline_seconds: DeadlineSeconds | None = Field(None, description=DEADLINE_HELP)
    # The payload by reference (docs/api.md, "Payload by reference"): an uploaded file of the tenant's.
    payload_file_id: Annotated[str, pattern("^file-[0-9a-f]{1,64}$", "a file id (file-...)")] | None = Field(
        None, description=PAYLOAD_FILE_HELP)


def given(*shapes: BaseModel, **values: Any) -> dict:
    """The option values a face's parsed shapes carry, by option name (the
    first shape with a value wins), plus ``values`` (derived: creator, passthrough)."""
    out = {}
    for name in SubmitOptions.model_fields:
        found = [getattr(s, name) for s in shapes if name in type(s).model_fields and getattr(s, name) is not None]
        if found:
            out[name] = found[0]
    return out | values


@dataclass(frozen=True)
class Face:
    """How one face's 422 names an option (``pointer``) and the payload."""
    pointer: Callable[[str], str]
    payload: str = ""


def _named(**own: str) -> Callable[[str], str]:
    """A face's pointer: its own names for some options, else the camelCase name."""
    return lambda option: own.get(option) or "/" + to_camel(option)


V1 = Face(_named(idempotency_key="/Idempotency-Key", deadline_seconds="/X-Deadline",
                 payload_file_id="/X-Payload-File"))
SEED = Face(_named(idempotency_key="/Idempotency-Key", deadline_seconds="/deadline"), "/requestPayload")


def batch_item(index: int) -> Face:
    return Face(lambda option: f"/jobs/{index}/{option}", f"/jobs/{index}/payload")


def request_hash(model: str, payload: Any, opts: SubmitOptions) -> str:
    parts = [model, payload, opts.biz_name, opts.callback_url, opts.model_key]
    if opts.webhook_url is not None:  # jobs without one hash as before
        parts += [opts.webhook_url, sorted(opts.webhook_events or [])]
    if opts.payload_file_id is not None:
        parts += [opts.payload_file_id]
    canon = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()


@dataclass(frozen=True)
class Checked:
    """An admissible submission: its model row, payload, options, digest."""
    model: Any
    payload: dict
    options: SubmitOptions
    digest: str


def _refused(face: Face, option: str, problem: str) -> ValidationFailed:
    return ValidationFailed(SubmitOptions.invalid, [{"pointer": face.pointer(option), "message": problem}])


def _options(face: Face, values: SubmitOptions | dict) -> SubmitOptions:
    if isinstance(values, SubmitOptions):
        return values
    try:
        return SubmitOptions.model_validate(values, by_alias=False, by_name=True)
    except ValidationError as exc:
        errors = []
        for e in pointer_errors(exc, SubmitOptions):
            option, sep, rest = e["pointer"][1:].partition("/")
            errors.append({**e, "pointer": face.pointer(option) + sep + rest})
        raise ValidationFailed(SubmitOptions.invalid, errors) from None


def check(face: Face, model_name: str, payload: Any, values: SubmitOptions | dict, lookups: Lookups,
          model=None) -> Checked:
    """THE submission rule (see the module's invariants).  ``lookups``: the
    request's host lookups (app/infra/http/netguard.py).  ``model``: the
    enabled model row if resolved already (a batch: once for all its items)."""
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    opts = _options(face, values)
    if opts.callback_url is not None and (problem := callback_url_problem(opts.callback_url, lookups)):
        raise _refused(face, "callback_url", problem)
    if opts.webhook_events is not None and opts.webhook_url is None:
        raise _refused(face, "webhook_events", "needs a webhook URL (X-Webhook-Url)")
    if opts.webhook_url is not None and (problem := callback_url_problem(opts.webhook_url, lookups)):
        raise _refused(face, "webhook_url", problem)
    model = model if model is not None else enabled_model(model_name)
    if opts.model_key:
        # Only the headers the model allows (app/infra/http/headers.py).
        problem = override_problem(parse_header_spec(opts.model_key), secretbox.decrypt(model.head_msg),
                                   getattr(model, "model_key_headers", ""))
        if problem:
            raise _refused(face, "model_key", problem)
    if opts.payload_file_id is not None:
        references.check(face.pointer("payload_file_id"), opts.payload_file_id, payload, lookups.tenant)
    else:
        validate_payload(model.form, payload, face.payload)
    return Checked(model, payload, opts, request_hash(model_name, payload, opts))
