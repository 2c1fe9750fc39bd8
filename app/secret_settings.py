"""Which settings are secrets, what a deployment may not start with, and how
`asynch env` shows them.

Invariants:
- Outside dev mode (ASYNCH_DEV_MODE) every server command refuses to start
  (``check_startup``) with an empty ASYNCH_KEY_PEPPER, ASYNCH_SECRETS_KEYS or
  ASYNCH_METRICS_TOKEN, a known placeholder in a secret or a URL's password,
  or a weak bootstrap admin key; one line per refusal, naming the variable
  and the fix.  Dev mode (`asynch dev`, the tests) accepts all of it.
- ``masked`` never shows a secret nor a URL's password (``***``).  A new
  setting whose name looks secret must be classified here
  (tests/test_security_deploy.py checks every field).
- Pure functions of a Settings object.
"""
from __future__ import annotations

import base64
import binascii
import re

from app.config import Settings, env_names

# Settings whose whole value is a secret.
SECRETS = frozenset({"bootstrap_admin_key", "key_pepper", "secrets_keys", "gateway_secret", "metrics_token",
                     "s3_secret_key", "oss_authorization"})
# Names that look secret but are not (a header name, a duration, an identifier, a header list).
NOT_SECRETS = frozenset({"gateway_secret_header", "delivery_secret_overlap_seconds", "s3_access_key",
                         "model_key_headers_default", "auth_mode", "auth_cache_seconds"})
SECRET_LOOKING = re.compile(r"secret|token|password|pepper|auth|_key")

# Words a placeholder contains (compared lowercased, without - _ . and spaces):
# what an example file, a tutorial or a template ships and an operator forgets.
PLACEHOLDER_WORDS = ("changeme", "replaceme", "fillme", "fillin", "example", "placeholder", "secret",
                     "password", "passwd", "default", "dummy", "sample", "insecure", "fixme", "letmein")

MIN_BOOTSTRAP_KEY_LENGTH = 32
MIN_BOOTSTRAP_KEY_DISTINCT = 10
_GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def url_password(url: str) -> str:
    """The password of ``scheme://user:password@host...``, or ''."""
    _scheme, sep, rest = url.partition("://")
    userinfo, at, _host = rest.rpartition("@")
    return userinfo.partition(":")[2] if sep and at else ""


def mask_url(url: str) -> str:
    """The URL with ``***`` for its password (unchanged without one)."""
    if not url_password(url):
        return url
    scheme, _sep, rest = url.partition("://")
    userinfo, _at, host = rest.rpartition("@")
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{host}"


def masked(name: str, value) -> str:
    """How `asynch env` shows setting ``name``: secrets as ``***``, URLs without their password."""
    if name in SECRETS:
        return "***" if value else ""
    return mask_url(value) if isinstance(value, str) and "://" in value else str(value)


def is_placeholder(value: str) -> bool:
    flat = re.sub(r"[-_. ]", "", value.lower())
    return any(word in flat for word in PLACEHOLDER_WORDS)


def _fernet_key_ok(key: str) -> bool:
    try:
        return len(base64.urlsafe_b64decode(key.encode())) == 32
    except (binascii.Error, ValueError):
        return False


def check_startup(s: Settings) -> None:
    """Refuse to serve with insecure secrets outside dev mode (every server
    command and app.wsgi call it): a ValueError, one line per problem."""
    if s.dev_mode:
        return
    var = env_names()
    out = []
    if not s.key_pepper:
        out.append(f"{var['key_pepper']} is empty: set it to a long random string ({_GENERATE})")
    if not s.secrets_keys.strip():
        out.append(f"{var['secrets_keys']} is empty (the Fernet key would be derived from the pepper): "
                   "set it to the output of `asynch secrets new-key`")
    elif not all(_fernet_key_ok(k.strip()) for k in s.secrets_keys.split(",") if k.strip()):
        out.append(f"{var['secrets_keys']} holds a value that is not a Fernet key: "
                   "use the output of `asynch secrets new-key`")
    if not s.metrics_token:
        out.append(f"{var['metrics_token']} is empty (anyone who reaches a metrics port reads it): "
                   f"set it to a long random string ({_GENERATE}) and give it to Prometheus")
    key = s.bootstrap_admin_key
    if key and len(key) < MIN_BOOTSTRAP_KEY_LENGTH:
        out.append(f"{var['bootstrap_admin_key']} is shorter than {MIN_BOOTSTRAP_KEY_LENGTH} characters: "
                   f"set a random one ({_GENERATE}) or leave it empty")
    elif key and len(set(key)) < MIN_BOOTSTRAP_KEY_DISTINCT:
        out.append(f"{var['bootstrap_admin_key']} has {len(set(key))} distinct characters (low entropy; at least "
                   f"{MIN_BOOTSTRAP_KEY_DISTINCT} needed): set a random one ({_GENERATE})")
    for name in sorted(SECRETS):
        if getattr(s, name) and is_placeholder(getattr(s, name)):
            out.append(f"{var[name]} is a placeholder (it contains one of {', '.join(PLACEHOLDER_WORDS)}): "
                       f"set a real value ({_GENERATE})")
    for name in Settings.model_fields:
        url = getattr(s, name)
        if isinstance(url, str) and "://" in url and is_placeholder(url_password(url)):
            out.append(f"{var[name]} has a placeholder password ({mask_url(url)}): put the real password in the URL")
    if out:
        raise ValueError("refusing to start outside dev mode (ASYNCH_DEV_MODE):\n" + "\n".join(f"  {p}" for p in out))
