"""Who a job is for: the tenant comes from the API key (app/services/keys.py);
the creator from the request's creator field / X-Creator header, or, when the
operator trusts a gateway in front of the API (ASYNCH_TRUSTED_GATEWAY), from
the X-User-Info header that gateway sets (it wins over the client's field)."""
from __future__ import annotations

import base64
import binascii
import json

from app.config import get_settings

_NAME_KEYS = ("username", "userName", "user_name", "name", "userId", "user_id", "uid", "id")


def _decode(value: str) -> dict | None:
    """JSON, or base64 (standard or URL-safe) JSON; None if neither."""
    try:
        data = json.loads(value)
        return data if isinstance(data, dict) else None
    except ValueError:
        pass
    try:
        std = value.replace("-", "+").replace("_", "/")
        raw = base64.b64decode(std + "=" * (-len(std) % 4), validate=True)
        data = json.loads(raw.decode("utf-8"))
        return data if isinstance(data, dict) else None
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None


def user_from_info(value: str) -> str:
    """The user named by an X-User-Info header: JSON (or base64 JSON) with one
    of the usual name keys, or a plain printable token."""
    value = value.strip()
    data = _decode(value)
    if data is not None:
        for k in _NAME_KEYS:
            v = data.get(k)
            if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip():
                return str(v).strip()[:128]
        return ""
    if value and len(value) <= 128 and all(0x20 < ord(c) < 0x7F for c in value) and "{" not in value:
        return value
    return ""


def creator_for(explicit: str | None, user_info: str | None) -> str:
    if get_settings().trusted_gateway and user_info:
        name = user_from_info(user_info)
        if name:
            return name
    return explicit or ""
