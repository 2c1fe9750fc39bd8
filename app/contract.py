"""The building blocks every request and response shape is declared with.

Each feature declares its shapes once, as pydantic models in its own
``schemas.py``; validation, the OpenAPI document, the defaults and the
console's forms all come from them.  ``Shape``: unknown fields refused,
snake_case names (v1) with camelCase aliases (the seed-002 face:
``parse(Model, data, face="seed")`` validates and points errors by alias).
Value types keep JSON's rules (2.0 is an integer, true and "2" are not; text
never holds NUL, which PostgreSQL cannot store).  ``rule()``: a field's rule in
words, its description and the message of a 422 about it.  Pydantic v2, not
marshmallow: its draft 2020-12 JSON Schema is OpenAPI 3.1's, with no
translation layer, and aliases give the camelCase face for free.
"""
from __future__ import annotations

import json
import math
import re
from datetime import date, datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer,
                      StrictBool, ValidationError, WithJsonSchema, create_model)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, PydanticUndefined

from app.clock import as_utc
from app.errors import ValidationFailed

Face = Literal["v1", "seed"]


class Shape(BaseModel):
    """A request or response body."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, validate_by_name=True, validate_by_alias=True)

    def values(self, only_given: bool = False) -> dict:
        """The fields as column values (only those given, for a change); null is ""
        for a text field whose default is "" (the seed sends null for "none")."""
        out = self.model_dump(exclude_unset=only_given)
        for k, v in out.items():
            if v is None and any(_empty_text_default(getattr(c, "model_fields", {}).get(k))
                                 for c in type(self).__mro__):
                out[k] = ""
        return out


def _empty_text_default(info: Any) -> bool:
    """A text field whose null means "none": default "" or from a text setting."""
    if info is None:
        return False
    if info.default_factory is not None:
        return isinstance(info.default_factory(), str)
    return info.default == ""


class Loose(Shape):
    """A shape that ignores fields it does not know (optional bodies)."""

    model_config = ConfigDict(extra="ignore")


class Params(BaseModel):
    """Query or header parameters, by name or by alias where Python cannot spell it
    (``from``, ``Idempotency-Key``), on both faces; unknown ones ignored, as HTTP does."""

    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True)


def rule(text: str, default: Any = PydanticUndefined, **extra: Any) -> Any:
    """Field(description=text); every 422 about the field says ``must be`` + text
    (``is required: `` + text when missing).  ``extra`` goes into its schema."""
    kw = {"default_factory": default} if callable(default) else {"default": default}
    return Field(description=text, json_schema_extra={"x-rule": text, **extra}, **kw)


def partial(model: type[BaseModel], name: str, doc: str) -> type[BaseModel]:
    """``model`` with every field optional: the shape of a change (PUT/PATCH).
    An absent field is not changed; an explicit null is judged by the field's type."""
    fields = {}
    for fname, info in model.model_fields.items():
        copy = Field(None, description=info.description, json_schema_extra=info.json_schema_extra, exclude=info.exclude)
        fields[fname] = (Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation, copy)
    return create_model(name, __base__=model, __doc__=doc, **fields)


_PATTERN_TEXT: dict[str, str] = {}


def pattern(regex: str, text: str, **kw: Any) -> Any:
    """Field(pattern=regex) whose mismatch message is ``must be`` + text."""
    _PATTERN_TEXT[regex] = text
    return Field(pattern=regex, description=text, **kw)

def _json_int(v: Any) -> Any:
    # JSON has one number type: 2.0 is the integer 2 (as JSON Schema says);
    # true is not a number and "2" is not an integer.
    if isinstance(v, (bool, str)) or (isinstance(v, float) and not v.is_integer()):
        raise PydanticCustomError("int_type", "must be an integer")
    return int(v) if isinstance(v, float) else v


def _query_int(v: Any) -> Any:
    # A query value is text: "12" is the integer 12, "1.5" or "abc" is none.
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            raise PydanticCustomError("int_type", "must be an integer") from None
    return _json_int(v)


def Int(lo: int | None = None, hi: int | None = None, query: bool = False) -> Any:
    """A JSON integer (or, ``query``, a query parameter's) within [lo, hi], shown as minimum/maximum."""
    return Annotated[int, Field(ge=lo, le=hi), BeforeValidator(_query_int if query else _json_int)]


def _bool_01(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    raise PydanticCustomError("bool_type", "must be true/false (or 1/0)")


# true/false, or the seed's 1/0 (true/false only: pydantic's StrictBool, imported above for the shapes;
# its bool_type error reads "must be true or false" like this one's).
Bool01 = Annotated[bool, BeforeValidator(_bool_01),
                   WithJsonSchema({"anyOf": [{"type": "boolean"}, {"type": "integer", "enum": [0, 1]}]})]


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise PydanticCustomError("nul", "must not contain NUL characters")
    return v


NO_NUL = "^[^\\x00]*$"
Text = Annotated[str, AfterValidator(_no_nul), pattern(NO_NUL, "text without NUL characters")]


def iso_z(dt: datetime | None) -> str | None:
    """The wire format of every time: UTC, ISO 8601, ``Z`` (a naive time is UTC, as every stored one)."""
    return None if dt is None else as_utc(dt).astimezone(timezone.utc).isoformat()[:-6] + "Z"


Timestamp = Annotated[datetime, PlainSerializer(iso_z, return_type=str),
                      WithJsonSchema({"type": "string", "format": "date-time"})]
Day = Annotated[date, PlainSerializer(lambda d: d.isoformat(), return_type=str),
                WithJsonSchema({"type": "string", "format": "date"})]


def _not_json(name: str):
    # Python's json takes NaN/Infinity, which JSON has not (and PostgreSQL's jsonb refuses).
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    # A literal past the double range (1e400) parses to inf, which json.dumps writes back as the
    # non-JSON Infinity: the stored payload would no longer be JSON.  Refused like the literal.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range (not a finite double)")
    return value

# A \\uD800-\\uDFFF escape: the only way a surrogate gets into parsed JSON
# (raw UTF-8 cannot carry one: decoding would fail first).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

def parse_json(raw: str | bytes):
    """Strict JSON, else ValueError: NaN/Infinity, a number beyond the double range
    (1e400: it would come back as Infinity), nesting too deep (not a 500), an
    unpaired surrogate (not Unicode text: PostgreSQL cannot store it)."""
    try:
        data = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    if _SURROGATE_ESCAPE.search(text):  # rare: only then pay for a full check
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, RecursionError) as exc:
            raise ValueError("a string has an unpaired surrogate (not Unicode text)") from exc
    return data


def parse(model: type[BaseModel], data: Any, *, face: Face = "v1", base: str = "",
          message: str | None = None, context: dict | None = None):
    """``data`` validated for one face, else ValidationFailed (422) with a pointer per
    problem and ``message`` (or the shape's own ``invalid`` text)."""
    message = message or getattr(model, "invalid", "invalid request body")
    by_alias, by_name = (True, True) if issubclass(model, Params) else (face == "seed", face == "v1")
    try:
        return model.model_validate(data, by_alias=by_alias, by_name=by_name, context=context)
    except ValidationError as exc:
        raise ValidationFailed(message, pointer_errors(exc, model, base)) from None


def dump(obj: BaseModel, face: Face = "v1", **kw) -> dict:
    """A response shape as JSON-ready data; v1: by each shape's own setting (snake_case unless it says)."""
    return obj.model_dump(mode="json", by_alias=True if face == "seed" else None, exclude_unset=True, **kw)


def pointer_token(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _field_rule(model: type[BaseModel] | None, loc: tuple) -> str | None:
    """The ``x-rule`` text of the field a location names, through nested models."""
    current, info = model, None
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = current.model_fields
        info = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if info is None:
            return None
        current = _inner_model(info.annotation)
    extra = info.json_schema_extra if info is not None else None
    return extra.get("x-rule") if isinstance(extra, dict) else None


def _inner_model(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in getattr(annotation, "__args__", ()) or () if (m := _inner_model(a)) is not None), None)


_GENERIC = {
    "missing": "is required", "extra_forbidden": "unknown field", "string_type": "must be a string",
    "int_type": "must be an integer", "int_parsing": "must be an integer", "int_from_float": "must be an integer",
    "float_type": "must be a number", "float_parsing": "must be a number", "bool_type": "must be true or false",
    "bool_parsing": "must be true or false", "list_type": "must be an array", "dict_type": "must be an object",
    "model_type": "must be an object", "model_attributes_type": "must be an object",
    # With values from the error's context (pydantic's ``ctx``).
    "greater_than_equal": "must be >= {ge}", "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}", "less_than": "must be < {lt}", "finite_number": "must be a finite number",
    "string_too_long": "must be at most {max_length} characters",
    "string_too_short": "must be at least {min_length} characters",
    "too_long": "must have at most {max_length} items", "too_short": "must have at least {min_length} items",
    "literal_error": "must be one of {expected}", "enum": "must be one of {expected}",
}


def _message(err: dict, model: type[BaseModel] | None) -> str:
    kind = err["type"]
    if kind in ("value_error", "assertion_error"):
        return str(err.get("ctx", {}).get("error", err["msg"]))
    custom = not err.get("url")  # PydanticCustomError: our own words
    if custom and kind not in ("int_type", "bool_type", "rule"):
        return err["msg"]
    if text := _field_rule(model, err["loc"]):
        return f"is required: {text}" if kind == "missing" else f"must be {text}"
    if custom:
        return err["msg"]
    # A bound of a float field comes as 0.0: said as the number it is ("must be > 0").
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in (err.get("ctx") or {}).items()}
    if kind in _GENERIC:
        return _GENERIC[kind].format_map(ctx)
    if kind == "string_pattern_mismatch":
        text = _PATTERN_TEXT.get(ctx.get("pattern"))
        return f"must be {text}" if text else f"must match {ctx.get('pattern')}"
    return err["msg"]


def pointer_errors(exc: ValidationError, model: type[BaseModel] | None = None, base: str = "") -> list[dict]:
    out = []
    for err in exc.errors(include_url=True):
        # Union members add their type name to the location; it is not in the request.
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "json-or-"))))
        pointer = base + "".join("/" + pointer_token(str(p)) for p in loc)
        entry = {"pointer": pointer, "message": _message({**err, "loc": loc}, model)}
        if entry not in out:
            out.append(entry)
    return out


# One periodic task's recorded run (no docstring: none in OpenAPI).
class BeatRun(Shape):
    model_config = ConfigDict(alias_generator=None)

    task: str
    ran_at: float = Field(description="unix time")
    took: float
    processed: int | None
    owner: str | None = None
    token: int | None = None
    sent_at: float | None = None
