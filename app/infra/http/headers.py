"""head_msg / modelKey: "Key:Value,Key2:Value2" header lists (seed 002).

Values are sent as strings (booleans and numbers too).  A header name must be
an HTTP token; CR, LF and NUL anywhere are refused so a configured header can
never split a request.  Values are secrets: only names are shown back.
"""
from __future__ import annotations

import re

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_FORBIDDEN = ("\r", "\n", "\x00")
REDACTED = "***"


class HeaderSpecError(ValueError):
    pass


def parse_header_spec(spec: str | None) -> dict[str, str]:
    """Parse "K:V,K2:V2" into an ordered dict; raises HeaderSpecError."""
    if spec is None:
        return {}
    if not isinstance(spec, str):
        raise HeaderSpecError("must be a string of Key:Value pairs")
    if any(c in spec for c in _FORBIDDEN):
        raise HeaderSpecError("must not contain CR, LF or NUL characters")
    out: dict[str, str] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        if ":" not in part:
            raise HeaderSpecError(f"{part.strip()!r} is not Key:Value")
        name, value = part.split(":", 1)
        name, value = name.strip(), value.strip()
        if not _TOKEN.match(name):
            raise HeaderSpecError(f"{name!r} is not a valid header name")
        if any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
            raise HeaderSpecError(f"value of {name} has control characters")
        out[name] = value
    return out


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
