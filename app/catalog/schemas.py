"""The catalog's contracts: a model's configuration (input and views), its
form's fields, and model types.  The API's validation, the OpenAPI document,
a new model's defaults, the CLI's import and the console's editor all come
from them; the database's server defaults mirror them (tests/test_schema.py).
"""
from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlparse

import re2
from pydantic import AfterValidator, Field, RootModel, ValidationInfo, create_model, field_validator
from pydantic_core import PydanticCustomError, PydanticUndefined

from app.catalog.forms import re2_compile
from app.config import get_settings
from app.contract import NO_NUL, Bool01, Int, Shape, StrictBool, Timestamp, partial, pattern, rule
from app.infra import secretbox
from app.infra.http.headers import (HEADER_NAMES_PATTERN, HEADER_NAMES_TEXT, HEADER_SPEC_PATTERN, HEADER_SPEC_TEXT,
                                    allowed_names, redact)

# Column sizes (app/infra/tables.py): longer values are refused here, not by the database.
MAX_URL_PART = 1024
MAX_TYPE_LIST = 512
MAX_TYPE_ID = 2**31 - 1  # asynch_models_type.type_id is an INTEGER

# base_url: http(s), an RFC 3986 authority in ASCII (IDN in punycode):
# userinfo@, a host name or a bracketed IPv6 literal (RFC 3986's IPv6address:
# exactly what urllib's split accepts), a numeric port; then any path, query
# or fragment without spaces or control characters.
_URL_CHAR = r"[^\x00-\x20\x7f]"
_H16 = "[0-9A-Fa-f]{1,4}"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LS32 = rf"(?:{_H16}:{_H16}|{_OCTET}(?:\.{_OCTET}){{3}})"
_IPV6 = "(?:" + "|".join([
    rf"(?:{_H16}:){{6}}{_LS32}",
    rf"::(?:{_H16}:){{5}}{_LS32}",
    rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
_AUTH_CHAR = r"[A-Za-z0-9\-._~!$&'()*+,;=%]"
BASE_URL_PATTERN = (rf"[Hh][Tt][Tt][Pp][Ss]?://(?:(?:{_AUTH_CHAR}|:)*@)?(?:{_AUTH_CHAR}+|\[{_IPV6}\])(?::[0-9]*)?"
                    rf"(?:[/?#]{_URL_CHAR}*)?")
ROUTE_PATTERN = rf"/{_URL_CHAR}*"
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
_TYPE_LIST = r"^(?:\s*[0-9]+(?:\s*,\s*[0-9]+)*\s*)?$"
FIELD_TYPES = ("string", "text", "number", "integer", "boolean", "select", "array", "object", "url", "image")
FIELD_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"


def _base_url(v: str) -> str:
    try:
        urlparse(v)  # checks that a bracketed host is an IPv6 address
    except ValueError:
        raise PydanticCustomError("rule", "not a URL") from None
    if not re.fullmatch(BASE_URL_PATTERN, v):
        raise PydanticCustomError("rule", "not a URL")
    return v.rstrip("/")


def _type_list(v: str) -> str:
    clean = ",".join(p.strip() for p in v.split(",")) if v.strip() else ""
    if len(clean) > MAX_TYPE_LIST:
        raise PydanticCustomError("rule", "too long")
    return clean


def _timeout_cap(v: int) -> int:
    if not 1 <= v <= get_settings().max_model_timeout_seconds:
        raise PydanticCustomError("rule", "out of range")
    return v


def _regex(v: str) -> str:
    try:
        re.compile(v)
    except (re.error, TypeError, ValueError, OverflowError, RecursionError):
        raise PydanticCustomError("regex", "must be a valid regular expression") from None
    try:
        re2_compile(v)  # linear-time matching (app/catalog/forms.py)
    except (re2.error, TypeError, ValueError):
        raise PydanticCustomError("regex", "must be a regular expression RE2 can run (no backreferences or "
                                           "lookaround)") from None
    return v


def _ints(lo: int, hi: int, default: Any = PydanticUndefined) -> Any:
    return rule(f"an integer from {lo} to {hi}", default)


class FormField(Shape):
    """One field of a model's form.  Keys it does not name (a hint, a
    placeholder) are kept for the console and ignored here."""

    # The one cross-field rule, stated in the JSON Schema (so clients and the
    # fuzzer see it) right beside the validator that enforces it.
    model_config = {"extra": "allow", "json_schema_extra": {
        "if": {"properties": {"type": {"const": "select"}}, "required": ["type"]},
        "then": {"properties": {"options": {"type": "array", "minItems": 1}}, "required": ["options"]},
    }}

    field: Annotated[str, Field(pattern=FIELD_NAME_PATTERN)] = rule("a field name (letters, digits, _ . -)")
    label: str | None = None
    type: Literal[FIELD_TYPES] = Field("string", description="how the value is checked and shown")  # type: ignore[valid-type]
    required: StrictBool = False
    options: list[Any] | None = Field(None, validate_default=True,
                                      description="the value must be one of them (a select needs some)")
    minLength: Int(0) | None = rule("a non-negative integer", None)
    maxLength: Int(0) | None = rule("a non-negative integer", None)
    min: int | float | None = None
    max: int | float | None = None
    pattern: Annotated[str, AfterValidator(_regex)] | None = Field(None, json_schema_extra={"format": "regex"})

    @field_validator("min", "max", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise PydanticCustomError("number", "must be a number")
        return v

    @field_validator("options")
    @classmethod
    def _select_has_options(cls, v: list | None, info: ValidationInfo) -> list | None:
        if info.data.get("type") == "select" and not v:
            raise PydanticCustomError("select", "a select needs a non-empty options array")
        return v


def _unique_fields(form: list[FormField] | None) -> list[FormField] | None:
    seen: set[str] = set()
    for f in form or []:
        if f.field in seen:
            raise PydanticCustomError("duplicate", "field names must be unique: '{name}' appears twice",
                                      {"name": f.field})
        seen.add(f.field)
    return form


Form = Annotated[list[FormField] | None, AfterValidator(_unique_fields)]

ModelName = Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]
BaseUrl = Annotated[str, Field(pattern=f"^{BASE_URL_PATTERN}$", max_length=MAX_URL_PART), AfterValidator(_base_url)]
Route = Annotated[str, Field(pattern=f"^(?:{ROUTE_PATTERN})?$", max_length=MAX_URL_PART)]
HeaderSpec = Annotated[str, pattern(HEADER_SPEC_PATTERN, HEADER_SPEC_TEXT)]
HeaderNames = Annotated[str, Field(max_length=4000), pattern(HEADER_NAMES_PATTERN, HEADER_NAMES_TEXT)]
TypeList = Annotated[str, Field(pattern=_TYPE_LIST, max_length=MAX_TYPE_LIST), AfterValidator(_type_list)]
Remark = Annotated[str, Field(max_length=4000, pattern=NO_NUL)]
HttpMethod = Annotated[str, Field(pattern="^(?:[Gg][Ee][Tt]|[Pp][Oo][Ss][Tt])$"), AfterValidator(str.upper)]


class ModelInput(Shape):
    """A model's configuration.  model_name and base_url are required; every
    other field has its default here (the one place defaults live)."""

    invalid: ClassVar[str] = "invalid model configuration"

    model_name: ModelName = rule("1-128 letters, digits, _ . - (starting with a letter or digit)")
    base_url: BaseUrl = rule(
        f"an http(s) URL of at most {MAX_URL_PART} characters: an ASCII host (IPv6 in brackets), "
        "an optional numeric port, no spaces or control characters")
    models_type: TypeList | None = rule(
        f"a comma-separated list of type ids, e.g. 1,2,3 (at most {MAX_TYPE_LIST} characters); "
        "the ids must exist", "")
    form: Form = Field(None, description="the fields a job's payload is checked against; names unique")
    route: Route | None = rule(
        f"a path starting with / of at most {MAX_URL_PART} characters, no spaces or control characters", "")
    http_method: HttpMethod = rule("GET or POST", "POST")
    head_msg: HeaderSpec | None = Field(
        "", description="K:V,K2:V2 headers sent to the model: names are HTTP tokens, values have no control "
                        "characters (CR, LF, NUL refused); secret, shown back as K:***",
        json_schema_extra={"writeOnly": True})
    model_key_headers: HeaderNames | None = Field(
        default_factory=lambda: get_settings().model_key_headers_default,
        description="header names a job's modelKey / X-Model-Key may set, comma-separated; * for any name "
                        "but the protected ones (Host, Content-Length, Transfer-Encoding, TE, Connection, "
                        "Keep-Alive, Trailer, Upgrade, Proxy-*, Cookie and head_msg's names), which pass only "
                        "when named; empty or null: none; left out: ASYNCH_MODEL_KEY_HEADERS_DEFAULT, as it is "
                        "set when each job is judged and sent (reads show the names in force)")
    enabled: Bool01 = rule("true/false (or 1/0)", True)
    max_concurrency: Int(1, 10_000) = rule("an integer from 1 to 10000: calls at once per tenant", 5)
    queue_limit: Int(0, 1_000_000) = rule("an integer from 0 to 1000000: pending + running jobs; 0 rejects all", 20)
    tenant_queue_limit: Int(0, 1_000_000) | None = rule(
        "an integer from 0 to 1000000: how many of queue_limit one tenant may hold (null: "
        "ASYNCH_TENANT_QUEUE_SHARE of it)", None)
    timeout_seconds: Annotated[Int(), AfterValidator(_timeout_cap)] = rule(
        "an integer from 1 to ASYNCH_MAX_MODEL_TIMEOUT_SECONDS: one model call's whole time",
        lambda: min(1800, get_settings().max_model_timeout_seconds),
        minimum=1, **{"x-maximum-setting": "max_model_timeout_seconds"})
    expected_seconds: Int(1, 7 * 86400) = _ints(1, 7 * 86400, 600)
    retry_times: Int(0, 100) = rule("an integer from 0 to 100: retries after the first try", 3)
    retry_queue_max_seconds: Int(0, 7 * 86400) = _ints(0, 7 * 86400, 600)
    auto_clean_seconds: Int(0, 365 * 86400) = rule(
        "an integer from 0 to 31536000: how long a claimed result is kept", 3600)
    max_completed: Int(0, 100_000_000) = rule(
        "an integer from 0 to 100000000: done/claimed jobs kept, the least recently read evicted beyond it "
        "(0: no cap)", 0)
    streaming: Bool01 = rule("true/false (or 1/0): the upstream may answer a stream (text/event-stream, "
                             "application/x-ndjson) whose output a job's stream_url shows live", False)
    remark: Remark | None = rule("a string of at most 4000 characters", "")
    # Read-only fields of a view: accepted and ignored, so a view can be sent back.
    created_at: Any = Field(None, exclude=True, description="read-only: ignored", json_schema_extra={"readOnly": True})
    updated_at: Any = Field(None, exclude=True, description="read-only: ignored", json_schema_extra={"readOnly": True})

    def values(self, only_given: bool = False) -> dict:
        out = super().values(only_given)
        if out.get("form") is not None:  # the form as written (no defaults filled in)
            out["form"] = [f.model_dump(exclude_unset=True) for f in self.form]
        if not only_given and "model_key_headers" not in self.model_fields_set:
            out["model_key_headers"] = None  # never set: the deployment's default, whenever it is set
        return out


ModelPatch = partial(ModelInput, "ModelPatch",
                     "A change to a model: only the fields given change (model_name, if given, must be the "
                     "model's own).")


class SeedModelUpdate(ModelPatch):  # type: ignore[misc, valid-type]
    """The seed's updateModel: modelName names the model, the other fields given change."""

    model_name: ModelName = rule("1-128 letters, digits, _ . - (starting with a letter or digit)")


class ModelView(Shape):
    """A model as shown to admins: every field, head_msg redacted."""

    model_name: str
    models_type: str
    form: list[dict] | None
    base_url: str
    route: str
    http_method: Literal["GET", "POST"]
    head_msg: str = Field(description="header names only: K:***,K2:***")
    model_key_headers: str
    enabled: bool
    max_concurrency: int
    queue_limit: int
    tenant_queue_limit: int | None
    timeout_seconds: int
    expected_seconds: int
    retry_times: int
    retry_queue_max_seconds: int
    auto_clean_seconds: int
    max_completed: int
    streaming: bool
    remark: str
    created_at: Timestamp | None
    updated_at: Timestamp | None


# What a non-admin key sees of a model: these of ModelView's fields, in this order.
ModelUserView = create_model(
    "ModelUserView", __base__=Shape, __doc__="What a non-admin key sees of a model: enough to submit to it.",
    **{name: (ModelView.model_fields[name].annotation, ...) for name in (
        "model_name", "models_type", "form", "enabled", "expected_seconds", "timeout_seconds", "queue_limit",
        "tenant_queue_limit", "max_concurrency", "streaming", "remark")})


class SeedModelView(ModelView):
    """The seed face shows enabled as 0/1."""

    enabled: Literal[0, 1]  # type: ignore[assignment]


class SeedModelUserView(ModelUserView):  # type: ignore[misc, valid-type]
    enabled: Literal[0, 1]  # type: ignore[assignment]


class AnyModelView(RootModel[ModelView | ModelUserView]):  # type: ignore[valid-type]
    """Admins see every field; other keys see model_name, models_type, form,
    enabled, expected_seconds, timeout_seconds, queue_limit, max_concurrency,
    remark."""


class ModelList(Shape):
    models: list[ModelView | ModelUserView]  # type: ignore[valid-type]


def model_view(row, is_admin: bool, face: str = "v1") -> Shape:
    """A model row as the caller may see it, on one face (the seed shows
    enabled as 0/1).  head_msg is a secret: only its header names show."""
    if is_admin:
        cls = SeedModelView if face == "seed" else ModelView
        values = {k: getattr(row, k) for k in ModelView.model_fields}
        values["head_msg"] = redact(secretbox.decrypt(row.head_msg))
        values["model_key_headers"] = allowed_names(row.model_key_headers)  # in force: its own or the default
    else:
        cls = SeedModelUserView if face == "seed" else ModelUserView
        values = {k: getattr(row, k) for k in ModelUserView.model_fields}
    if face == "seed":
        values["enabled"] = 1 if row.enabled else 0
    return cls.model_construct(**values)


class SeedAnyModelView(RootModel[SeedModelView | SeedModelUserView]):
    """The seed face of AnyModelView (enabled as 0/1)."""


model_view.admin = ModelView  # type: ignore[attr-defined]  (the shapes routes declare)
model_view.any = AnyModelView  # type: ignore[attr-defined]
model_view.seed_any = SeedAnyModelView  # type: ignore[attr-defined]


class ModelNameBody(Shape):
    """A body that names one model (the seed's deleteModel)."""

    invalid: ClassVar[str] = "invalid request"

    model_name: Annotated[str, Field(min_length=1, pattern=NO_NUL)] = rule("a non-empty string")


# --- model types -----------------------------------------------------------------------

TypeName = Annotated[str, Field(min_length=1, max_length=128,
                                pattern="^[^\\x00-\\x1f]*[^\\x00-\\x1f\\s][^\\x00-\\x1f]*$"),
                     AfterValidator(str.strip)]


class ModelTypeInput(Shape):
    """A model type; without type_id the next free id is taken."""

    invalid: ClassVar[str] = "invalid model type"

    type_id: Int(1, MAX_TYPE_ID) | None = _ints(1, MAX_TYPE_ID, None)
    type_name: TypeName = rule("1-128 characters, not blank, no control characters")
    remark: Remark | None = rule("a string of at most 4000 characters", "")


ModelTypePatch = partial(ModelTypeInput, "ModelTypePatch",
                         "A change to a model type: only the fields given change (type_id, if given, must be "
                         "the one named).")


class SeedModelTypeUpdate(ModelTypePatch):  # type: ignore[misc, valid-type]
    """The seed's modelType/update: typeId names the type, the other fields given change."""

    type_id: Int(1, MAX_TYPE_ID) = _ints(1, MAX_TYPE_ID)


class ModelTypeView(Shape):
    type_id: int
    type_name: str
    remark: str
    created_at: Timestamp | None

    @classmethod
    def from_row(cls, row) -> "ModelTypeView":
        return cls.model_construct(**{k: getattr(row, k) for k in cls.model_fields})


class ModelTypeList(Shape):
    model_types: list[ModelTypeView]


class TypeIdBody(Shape):
    """A body that names one model type (the seed's delete)."""

    invalid: ClassVar[str] = "invalid request"

    type_id: Int() = rule("an integer")
