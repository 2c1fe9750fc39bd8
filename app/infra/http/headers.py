"""head_msg / modelKey: "Key:Value,Key2:Value2" header lists (seed 002).

Values are sent as strings.  A name is an HTTP token, a value Latin-1 text; CR, LF and NUL are refused anywhere, so
a spec that validated can always be sent and never splits a request.  Values are secrets: only names are shown.

A job's modelKey may set only the headers its model allows (``model_key_headers``: names, or ``*`` for any but the
protected ones; empty allows none).  Protected -- framing, routing and credentials (Host, Content-Length,
Transfer-Encoding, TE, Connection, Keep-Alive, Trailer, Upgrade, Expect, Proxy-*, Cookie, Forwarded, X-Forwarded-*,
X-Real-IP, Via) and every header head_msg sets -- pass only when named explicitly; reserved (X-Asynch-*, the
middleware's own) never.  A model that never set its own (``None``: NULL) allows what
ASYNCH_MODEL_KEY_HEADERS_DEFAULT names when the job is judged and when it is sent (``allowed_names``).
``override_problem`` judges at submit (a 422), ``job_headers`` again at call time.  Names compare
case-insensitively everywhere: a request never carries one name twice.
"""
from __future__ import annotations

import re

from app.config import get_settings

_TOKEN_CHARS = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_TOKEN = re.compile(_TOKEN_CHARS)
REDACTED = "***"
# The rule, once (the JSON Schema of head_msg / modelKey carries it too): comma-separated parts, each blank or
# "token:value", a value being tab, printable ASCII but the comma, or the rest of Latin-1.
_VALUE_CHARS = r"[\t\x20-\x2b\x2d-\x7e\x80-\xff]*"
_LIST = r"^[ \t]*(?:{0})?(?:,[ \t]*(?:{0})?)*$"  # comma-separated items, each may be blank
HEADER_SPEC_PATTERN = _LIST.format(_TOKEN_CHARS + r"[ \t]*:" + _VALUE_CHARS)
HEADER_SPEC_TEXT = ("Key:Value pairs separated by commas (names are HTTP tokens, values are Latin-1 text "
                    "without control characters but tab)")
# model_key_headers: header names (or *) separated by commas.
HEADER_NAMES_PATTERN = _LIST.format(_TOKEN_CHARS + r"[ \t]*")
HEADER_NAMES_TEXT = "header names (HTTP tokens) separated by commas, or * for any unprotected name"
PROTECTED = frozenset({"host", "content-length", "transfer-encoding", "te", "connection", "keep-alive",
                       "trailer", "upgrade", "expect", "cookie", "forwarded", "x-real-ip", "via"})
PROTECTED_PREFIXES = ("proxy-", "x-forwarded-")
# The middleware's own headers on every model call (model_client.py).
RESERVED_PREFIX = "x-asynch-"
JOB_HEADER, ATTEMPT_HEADER = "X-Asynch-Job-Id", "X-Asynch-Attempt"
_SPEC = re.compile(HEADER_SPEC_PATTERN)


class HeaderSpecError(ValueError):
    pass


def parse_header_spec(spec: str | None) -> dict[str, str]:
    """Parse "K:V,K2:V2" into an ordered dict; raises HeaderSpecError."""
    if spec is None:
        return {}
    if not isinstance(spec, str):
        raise HeaderSpecError("must be a string of Key:Value pairs")
    if not _SPEC.fullmatch(spec):
        raise HeaderSpecError(_diagnose(spec))
    pairs = (part.split(":", 1) for part in spec.split(",") if part.strip(" \t"))
    return {name.strip(" \t"): value.strip(" \t") for name, value in pairs}


def _diagnose(spec: str) -> str:
    """Why ``spec`` does not match HEADER_SPEC_PATTERN, in words (the pattern decides)."""
    if any(c in spec for c in "\r\n\x00"):
        return "must not contain CR, LF or NUL characters"
    for part in (p for p in spec.split(",") if p.strip(" \t")):
        if ":" not in part:
            return f"{part.strip()!r} is not Key:Value"
        name, value = part.split(":", 1)
        if not _TOKEN.fullmatch(name.strip(" \t")):
            return f"{name.strip()!r} is not a valid header name"
        if any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
            return f"value of {name.strip()} has control characters"
        if any(ord(c) > 0xFF for c in value):
            return f"value of {name.strip()} is not Latin-1 text (HTTP header values are bytes 0-255)"
    return "must be " + HEADER_SPEC_TEXT


def merge_headers(base: dict[str, str], override: dict[str, str]) -> dict[str, str]:
    """A job's modelKey overrides or extends the model's head_msg (names compare case-insensitively)."""
    merged = dict(base)
    for k, v in override.items():
        merged = {e: x for e, x in merged.items() if e.lower() != k.lower()} | {k: v}
    return merged


def redact(spec: str | None) -> str:
    """"API_KEY:abc,X:1" -> "API_KEY:***,X:***"."""
    try:
        names = parse_header_spec(spec)
    except HeaderSpecError:
        return REDACTED
    return ",".join(f"{k}:{REDACTED}" for k in names)


def allowed_names(spec: str | None) -> str:
    """A model's model_key_headers as they apply now: its own, or (None: it never set them) the
    deployment's ASYNCH_MODEL_KEY_HEADERS_DEFAULT."""
    return get_settings().model_key_headers_default if spec is None else spec


def override_problem(override: dict[str, str], head_msg: str | None, allowed_spec: str | None) -> str | None:
    """Why a job's modelKey headers may not be sent to this model, or None (``allowed_spec``: the
    model's model_key_headers; None: the default, ``allowed_names``)."""
    allowed = {n.strip(" \t").lower() for n in allowed_names(allowed_spec).split(",")}  # "*" kept as is
    try:
        base = frozenset(n.lower() for n in parse_header_spec(head_msg))
    except HeaderSpecError:
        base = frozenset()
    for name in override:
        n = name.lower()
        if n.startswith(RESERVED_PREFIX):
            return f"header {name} may not be set by a job (reserved: the middleware sends it)"
        if n in allowed:
            continue
        if n in PROTECTED or n.startswith(PROTECTED_PREFIXES) or n in base:
            return f"header {name} may not be set by a job (protected; the model must name it in model_key_headers)"
        if "*" not in allowed:
            return f"header {name} may not be set by a job (not in the model's model_key_headers)"
    return None


def job_headers(head_msg: str | None, model_key: str | None, allowed_spec: str | None) -> dict[str, str]:
    """The headers a call sends: head_msg, overridden by the modelKey headers the model allows.  Raises
    HeaderSpecError, never UnicodeEncodeError (the pattern admits Latin-1 values only)."""
    base, override = parse_header_spec(head_msg), parse_header_spec(model_key)
    problem = override_problem(override, head_msg, allowed_spec)
    if problem:
        raise HeaderSpecError(problem)
    return merge_headers(base, override)
