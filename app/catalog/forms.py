"""A model's ``form``: the field list the console renders and every payload
is validated against (its own shape: FormField, app/catalog/schemas.py).
This module is the one place a form is applied to a payload.

Types: string, text, number, integer, boolean, select (with ``options``),
array, object, url, image (a URL or data: URI).  Rules: minLength/maxLength
(strings, arrays), min/max (numbers), pattern (strings), options (any type).
Fields not in the form pass through untouched.

A ``pattern`` runs on RE2: linear in the input, whatever the pattern.  A
pattern stored before the RE2 rule that RE2 cannot compile runs on Python's
``re`` over at most PATTERN_FALLBACK_CHARS characters.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import re2

from app.contract import pointer_token
from app.errors import ValidationFailed


PATTERN_FALLBACK_CHARS = 256
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


def re2_compile(pattern: str):
    """The RE2 program of ``pattern``; raises re2.error if RE2 cannot run it."""
    return re2.compile(pattern, options=_RE2_OPTIONS)


@lru_cache(maxsize=1024)
def _matcher(pattern: str):
    try:
        return re2_compile(pattern).search
    except re2.error:
        legacy = re.compile(pattern)
        return lambda v: legacy.search(v[:PATTERN_FALLBACK_CHARS])


def _option_value(o: Any) -> Any:
    # Options may be plain values or {"value", "label"} objects.
    return o.get("value") if isinstance(o, dict) and "value" in o else o


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1 (Python's True == 1 would let it pass)."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_STRING = (lambda v: isinstance(v, str), "must be a string")
_HTTP = re.compile(r"^https?://")
# type -> its checks in order, each (passes, the message otherwise); a select is checked against its options.
_CHECKS = {
    "string": [_STRING], "text": [_STRING],
    "url": [_STRING, (lambda v: _HTTP.match(v), "must be an http(s) URL")],
    "image": [_STRING, (lambda v: _HTTP.match(v) or v.startswith("data:"), "must be an image URL or a data: URI")],
    "boolean": [(lambda v: isinstance(v, bool), "must be true or false")],
    "integer": [(lambda v: isinstance(v, int) and not isinstance(v, bool), "must be an integer")],
    "number": [(_is_number, "must be a number")],
    "array": [(lambda v: isinstance(v, list), "must be an array")],
    "object": [(lambda v: isinstance(v, dict), "must be an object")],
}


def payload_errors(form: list | None, payload: dict, base: str = "") -> list[dict]:
    """Every problem of ``payload`` against ``form``, each with a JSON pointer."""
    errs: list[dict] = []
    for f in form or []:
        name = f["field"]
        p = base + "/" + pointer_token(name)
        if name not in payload or payload[name] is None:
            if f.get("required"):
                errs.append({"pointer": p, "message": "is required"})
            continue
        v = payload[name]
        if msg := next((m for ok, m in _CHECKS.get(f.get("type", "string"), ()) if not ok(v)), None):
            errs.append({"pointer": p, "message": msg})
            continue
        if f.get("required") and isinstance(v, str) and v.strip() == "":
            errs.append({"pointer": p, "message": "must not be empty"})
            continue
        opts = f.get("options")
        if isinstance(opts, list) and opts and not any(_same(v, _option_value(o)) for o in opts):
            errs.append({"pointer": p, "message": "must be one of the options: "
                         + ", ".join(repr(_option_value(o)) for o in opts)})
            continue
        if isinstance(v, (str, list)):
            if "minLength" in f and len(v) < f["minLength"]:
                errs.append({"pointer": p, "message": f"must have at least {f['minLength']} characters/items"})
            if "maxLength" in f and len(v) > f["maxLength"]:
                errs.append({"pointer": p, "message": f"must have at most {f['maxLength']} characters/items"})
        if isinstance(v, str) and "pattern" in f and not _matcher(f["pattern"])(v):
            errs.append({"pointer": p, "message": f"must match {f['pattern']}"})
        if _is_number(v):
            if "min" in f and v < f["min"]:
                errs.append({"pointer": p, "message": f"must be >= {f['min']}"})
            if "max" in f and v > f["max"]:
                errs.append({"pointer": p, "message": f"must be <= {f['max']}"})
    return errs


def validate_payload(form: list | None, payload: dict, base: str = "") -> None:
    if errs := payload_errors(form, payload, base):
        raise ValidationFailed("request body does not match the model's form", errs)
