"""head_msg / modelKey: "Key:Value,Key2:Value2" header lists (seed 002).

Values are sent as strings (booleans and numbers too).  A header name must be
an HTTP token; CR, LF and NUL anywhere are refused so a configured header can
never split a request, and a value is Latin-1 text (what HTTP/1.1 can carry),
so a spec that validated can always be sent.  Values are secrets: only names
are shown back.

A job's modelKey may set only the headers its model allows
(``model_key_headers``: names, or ``*`` for any name but the protected ones;
empty, the default, allows none).  Protected -- framing, routing and
credentials a proxy or the model trusts (Host, Content-Length,
Transfer-Encoding, TE, Connection, Keep-Alive, Trailer, Upgrade, Expect,
Proxy-*, Cookie, Forwarded, X-Forwarded-*, X-Real-IP, Via) and every header
the model's head_msg sets -- pass only when the model names them
explicitly.  Reserved -- the headers the middleware itself sends with every
call (X-Asynch-*: the job id and attempt a model deduplicates by) -- never
pass.  ``override_problem`` judges at submit (a 422), ``job_headers`` again
at call time (the model may have changed since).

Header names compare case-insensitively everywhere, as HTTP does: in the
allowlist, the protected and reserved names, and when the call's headers
are merged (``merge_headers``), so a request never carries one name twice.
"""
from __future__ import annotations

import re

_TOKEN_CHARS = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_TOKEN = re.compile(_TOKEN_CHARS)
_FORBIDDEN = ("\r", "\n", "\x00")
REDACTED = "***"
# The rule, once: comma-separated parts, each blank or "name:value" (an HTTP
# token, optional blanks, a colon, then text without commas or control
# characters other than tab).  The JSON Schema of head_msg / modelKey
# carries this same pattern (ECMA-262 and Python read it alike), and
# parse_header_spec refuses what it does not match.
# Value characters: tab, printable ASCII but the comma, and the rest of
# Latin-1 (\x80-\xff); nothing a header line cannot carry.
_VALUE_CHARS = r"[\t\x20-\x2b\x2d-\x7e\x80-\xff]*"
HEADER_SPEC_PATTERN = (r"^[ \t]*(?:" + _TOKEN_CHARS + r"[ \t]*:" + _VALUE_CHARS + r")?"
                       r"(?:,[ \t]*(?:" + _TOKEN_CHARS + r"[ \t]*:" + _VALUE_CHARS + r")?)*$")
HEADER_SPEC_TEXT = ("Key:Value pairs separated by commas (names are HTTP tokens, values are Latin-1 text "
                    "without control characters but tab)")
# model_key_headers: header names (or *) separated by commas.
HEADER_NAMES_PATTERN = (r"^[ \t]*(?:" + _TOKEN_CHARS + r"[ \t]*)?(?:,[ \t]*(?:" + _TOKEN_CHARS
                        + r"[ \t]*)?)*$")
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
    out: dict[str, str] = {}
    for part in spec.split(","):
        if part.strip(" \t"):
            name, value = part.split(":", 1)
            out[name.strip(" \t")] = value.strip(" \t")
    return out


def _diagnose(spec: str) -> str:
    """Why ``spec`` does not match HEADER_SPEC_PATTERN, in words (the
    pattern decides; this only explains)."""
    if any(c in spec for c in _FORBIDDEN):
        return "must not contain CR, LF or NUL characters"
    for part in spec.split(","):
        if not part.strip(" \t"):
            continue
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
    """A job's modelKey overrides or extends the model's head_msg
    (header names compare case-insensitively, as HTTP does)."""
    merged = dict(base)
    for k, v in override.items():
        for existing in [e for e in merged if e.lower() == k.lower()]:
            del merged[existing]
        merged[k] = v
    return merged


def redact(spec: str | None) -> str:
    """"API_KEY:abc,X:1" -> "API_KEY:***,X:***"."""
    try:
        names = parse_header_spec(spec)
    except HeaderSpecError:
        return REDACTED
    return ",".join(f"{k}:{REDACTED}" for k in names)


def allowed_names(spec: str | None) -> frozenset[str]:
    """model_key_headers "X-A, X-B" -> {"x-a", "x-b"} (``*`` kept as is)."""
    return frozenset(n.strip(" \t").lower() for n in (spec or "").split(",") if n.strip(" \t"))


def _protected(name: str, head_msg_names: frozenset[str]) -> bool:
    n = name.lower()
    return n in PROTECTED or n.startswith(PROTECTED_PREFIXES) or n in head_msg_names


def override_problem(override: dict[str, str], head_msg: str | None, allowed_spec: str | None) -> str | None:
    """Why a job's modelKey headers may not be sent to this model, or None."""
    allowed = allowed_names(allowed_spec)
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
        if _protected(name, base):
            return f"header {name} may not be set by a job (protected; the model must name it in model_key_headers)"
        if "*" not in allowed:
            return f"header {name} may not be set by a job (not in the model's model_key_headers)"
    return None


def job_headers(head_msg: str | None, model_key: str | None, allowed_spec: str | None) -> dict[str, str]:
    """The headers a call sends: head_msg, overridden by the modelKey headers
    the model allows.  Raises HeaderSpecError (never UnicodeEncodeError)."""
    base = parse_header_spec(head_msg)
    override = parse_header_spec(model_key)
    problem = override_problem(override, head_msg, allowed_spec)
    if problem:
        raise HeaderSpecError(problem)
    out = merge_headers(base, override)
    for k, v in out.items():
        try:
            v.encode("latin-1")
        except UnicodeEncodeError:
            raise HeaderSpecError(f"value of {k} is not Latin-1 text") from None
    return out
