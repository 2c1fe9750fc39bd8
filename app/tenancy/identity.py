"""Who a job is for: the tenant from the API key, or in gateway auth mode
from the X-User-Info the proven gateway sets (``tenant_from_info``); the
creator from the creator field / X-Creator, or from a vouched-for
X-User-Info, which wins.

Only a request that passed the gateway's proof (app/web/auth.py
``trusted_user_info``) has a vouched-for X-User-Info; the functions here
take that value (None when there is none), never the raw header, so an
unproven one is neither the creator nor passed to the OSS file service
(``oss_passthrough``) under the operator's credential.
"""
from __future__ import annotations

import base64
import json

from app.config import get_settings

_TENANT_KEYS = ("tenantId", "tenant_id", "tenant", "tenantCode", "tenant_code")
_NAME_KEYS = ("username", "userName", "user_name", "name", "userId", "user_id", "uid", "id")


def _decode(value: str) -> dict | None:
    """JSON, or base64 (standard or URL-safe) JSON; None if neither."""
    try:
        data = json.loads(value)
    except ValueError:
        try:
            std = value.replace("-", "+").replace("_", "/")
            data = json.loads(base64.b64decode(std + "=" * (-len(std) % 4), validate=True).decode("utf-8"))
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            return None
    return data if isinstance(data, dict) else None


def _named(data: dict, names) -> str:
    """The first of ``names`` holding a non-blank string or integer, stripped."""
    for k in names:
        v = data.get(k)
        if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip():
            return str(v).strip()
    return ""


def tenant_from_info(value: str | None) -> str:
    """The tenant an X-User-Info header names (JSON or base64 JSON, one of
    the usual tenant keys), else ASYNCH_GATEWAY_DEFAULT_TENANT; "" if
    neither.  Not yet judged: the caller checks it is a tenant name."""
    data = _decode(value.strip()) if value else None
    return (_named(data, _TENANT_KEYS) if data is not None else "") or get_settings().gateway_default_tenant


def creator_for(explicit: str | None, trusted_info: str | None) -> str:
    """The user ``trusted_info`` (the X-User-Info a proven gateway vouches for, or None)
    names: JSON (or base64 JSON) with one of the usual name keys, or a plain printable
    token; else ``explicit``."""
    value = (trusted_info or "").strip()
    data = _decode(value) if value else None
    if data is not None:
        user = _named(data, _NAME_KEYS)[:128]
    else:
        user = value if len(value) <= 128 and all(0x20 < ord(c) < 0x7F for c in value) and "{" not in value else ""
    return user or explicit or ""


def oss_passthrough(oss_authorization: str | None, trusted_info: str | None) -> dict[str, str] | None:
    """The headers a job carries to the OSS file service: the caller's own
    credential for it (X-Oss-Authorization, sent as Authorization) and the
    X-User-Info a proven gateway vouches for (``trusted_info``), if any."""
    return {k: v for k, v in (("Authorization", oss_authorization), ("X-User-Info", trusted_info)) if v} or None
