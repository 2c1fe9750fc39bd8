"""Model configuration (table asynch_models): validation and CRUD.

Input and output use the v1 (snake_case) field names; the seed-002 face maps
its camelCase names onto these.  head_msg is a secret: it is validated on
save and only its header names are ever shown back.
"""
from __future__ import annotations

import re
from urllib.parse import urlparse

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.clock import now as clock_now
from app.config import get_settings
from app.infra.db import transaction
from app.errors import Conflict, NotFound, ValidationFailed
from app.infra.tables import models, tasks
from app.catalog.forms import validate_form_definition
from app.infra.http.headers import HeaderSpecError, parse_header_spec, redact
from app.catalog.model_types import unknown_ids
from app.catalog.values import as_int
from app.states import ACTIVE_STATES
from app.infra.redis_scripts import publish_invalidate
from app.infra.caches import MISSING, TTLCache

# model_name -> row (or None), for the submit path only.  Writers here
# invalidate it; other processes see a change within model_cache_seconds.
_cache = TTLCache(lambda: get_settings().model_cache_seconds)

# Column sizes (app/models.py): longer values are refused here, not by the database.
MAX_URL_PART = 1024
MAX_TYPE_LIST = 512
# base_url: http(s), a non-empty authority (an IPv6 literal in brackets), no
# spaces or control characters anywhere.  The OpenAPI document uses the same
# patterns (app/openapi.py).
_URL_CHAR = r"[^\x00-\x20\x7f]"
_AUTH_CHAR = r"[^/?#\[\]\x00-\x20\x7f]"
BASE_URL_PATTERN = (rf"[Hh][Tt][Tt][Pp][Ss]?://(?:{_AUTH_CHAR}+|{_AUTH_CHAR}*\[[0-9A-Fa-f:.]+\]{_AUTH_CHAR}*)"
                    rf"(?:[/?#]{_URL_CHAR}*)?")
ROUTE_PATTERN = rf"/{_URL_CHAR}*"
_BASE_URL = re.compile(BASE_URL_PATTERN)
_ROUTE = re.compile(ROUTE_PATTERN)
_TYPE_LIST = re.compile(r"\s*\d+(\s*,\s*\d+)*\s*", re.ASCII)  # ASCII: no other scripts' digits
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # \Z: "$" also matches before a final newline

# field -> (default, validator returning an error message or None)
_INT_FIELDS = {
    "max_concurrency": (5, 1, 10_000),
    "queue_limit": (20, 0, 1_000_000),
    "expected_seconds": (600, 1, 7 * 86400),
    "retry_times": (3, 0, 100),
    "retry_queue_max_seconds": (600, 0, 7 * 86400),
    "auto_clean_seconds": (3600, 0, 365 * 86400),
}
FIELDS = ("model_name", "models_type", "form", "base_url", "route", "http_method", "head_msg",
          "enabled", "max_concurrency", "queue_limit", "timeout_seconds", "expected_seconds",
          "retry_times", "retry_queue_max_seconds", "auto_clean_seconds", "remark")


def _invalidate(name: str) -> None:
    _cache.invalidate(name)
    publish_invalidate("models")


def _check(data: dict, partial: bool) -> tuple[dict, list[dict]]:
    """Validate and normalise model fields; returns (clean values, errors)."""
    errs: list[dict] = []
    clean: dict = {}

    def err(field: str, msg: str) -> None:
        errs.append({"pointer": "/" + field, "message": msg})

    # Read-only fields of a model view are ignored, so a view can be sent back.
    unknown = sorted(set(data) - set(FIELDS) - {"created_at", "updated_at"})
    for k in unknown:
        err(k, "unknown field")

    def present(k: str) -> bool:
        return k in data

    if present("model_name") or not partial:
        v = data.get("model_name")
        if not isinstance(v, str) or not MODEL_NAME.match(v):
            err("model_name", "is required: 1-128 letters, digits, _ . - (starting with a letter or digit)")
        else:
            clean["model_name"] = v
    if present("base_url") or not partial:
        v = data.get("base_url")
        try:
            # urlparse checks a bracketed host is an IPv6 address.
            u = urlparse(v) if isinstance(v, str) else None
        except ValueError:  # e.g. "http://[::1": an unclosed IPv6 bracket
            u = None
        if not u or not _BASE_URL.fullmatch(v) or len(v) > MAX_URL_PART:
            err("base_url", f"is required: an http(s) URL of at most {MAX_URL_PART} characters, no spaces "
                            "or control characters")
        else:
            clean["base_url"] = v.rstrip("/")
    if present("route"):
        v = data["route"]
        if v is None or v == "":
            clean["route"] = ""
        elif not isinstance(v, str) or not _ROUTE.fullmatch(v) or len(v) > MAX_URL_PART:
            err("route", f"must be a path starting with / of at most {MAX_URL_PART} characters, no spaces "
                         "or control characters")
        else:
            clean["route"] = v
    if present("http_method"):
        v = data["http_method"]
        if not isinstance(v, str) or v.upper() not in ("GET", "POST"):
            err("http_method", "must be GET or POST")
        else:
            clean["http_method"] = v.upper()
    if present("head_msg"):
        v = data["head_msg"] if data["head_msg"] is not None else ""
        try:
            parse_header_spec(v)
            clean["head_msg"] = v
        except HeaderSpecError as exc:
            err("head_msg", str(exc))
    if present("enabled"):
        v = data["enabled"]
        if isinstance(v, bool):
            clean["enabled"] = v
        elif as_int(v) in (0, 1):
            clean["enabled"] = bool(v)
        else:
            err("enabled", "must be true/false (or 1/0)")
    if present("timeout_seconds"):
        v = as_int(data["timeout_seconds"])
        cap = get_settings().max_model_timeout_seconds
        if v is None or not 1 <= v <= cap:
            err("timeout_seconds", f"must be an integer from 1 to {cap}")
        else:
            clean["timeout_seconds"] = v
    for k, (_default, lo, hi) in _INT_FIELDS.items():
        if present(k):
            v = as_int(data[k])
            if v is None or not lo <= v <= hi:
                err(k, f"must be an integer from {lo} to {hi}")
            else:
                clean[k] = v
    if present("models_type"):
        v = data["models_type"]
        if v is None or v == "":
            clean["models_type"] = ""
        elif not isinstance(v, str) or not _TYPE_LIST.fullmatch(v) or \
                len(",".join(p.strip() for p in v.split(","))) > MAX_TYPE_LIST:
            err("models_type", f"must be a comma-separated list of type ids, e.g. 1,2,3 "
                               f"(at most {MAX_TYPE_LIST} characters)")
        else:
            clean["models_type"] = ",".join(p.strip() for p in v.split(","))
    if present("form"):
        form_errs = validate_form_definition(data["form"])
        errs.extend(form_errs)
        if not form_errs:
            clean["form"] = data["form"]
    if present("remark"):
        v = data["remark"] if data["remark"] is not None else ""
        if not isinstance(v, str) or len(v) > 4000:
            err("remark", "must be a string of at most 4000 characters")
        else:
            clean["remark"] = v
    return clean, errs


def _check_types(conn: Connection, clean: dict, errs: list[dict]) -> None:
    """models_type must name existing asynch_models_type ids."""
    if clean.get("models_type"):
        missing = unknown_ids(conn, [int(x) for x in clean["models_type"].split(",")])
        if missing:
            errs.append({"pointer": "/models_type",
                         "message": "unknown model type ids: " + ", ".join(map(str, missing))})


# What a non-admin key sees of a model: enough to submit to it.
USER_FIELDS = ("model_name", "models_type", "form", "enabled", "expected_seconds", "timeout_seconds",
               "queue_limit", "max_concurrency", "remark")


def view_for(m: dict, is_admin: bool) -> dict:
    return m if is_admin else {k: m[k] for k in USER_FIELDS}


def public_view(row) -> dict:
    """A model as shown to admins: every field, head_msg redacted."""
    d = {k: getattr(row, k) for k in FIELDS}
    d["head_msg"] = redact(row.head_msg)
    d["created_at"] = row.created_at.isoformat() if row.created_at else None
    d["updated_at"] = row.updated_at.isoformat() if row.updated_at else None
    return d


def create_model(conn: Connection, data: dict) -> dict:
    if not isinstance(data, dict):
        raise ValidationFailed("model must be a JSON object", [{"pointer": "", "message": "must be an object"}])
    clean, errs = _check(data, partial=False)
    _check_types(conn, clean, errs)
    if errs:
        raise ValidationFailed("invalid model configuration", errs)
    now = clock_now()
    clean.setdefault("timeout_seconds", min(1800, get_settings().max_model_timeout_seconds))
    for k, (default, _lo, _hi) in _INT_FIELDS.items():
        clean.setdefault(k, default)
    clean.setdefault("route", "")
    clean.setdefault("http_method", "POST")
    clean.setdefault("head_msg", "")
    clean.setdefault("enabled", True)
    clean.setdefault("models_type", "")
    clean.setdefault("remark", "")
    try:
        with conn.begin_nested():
            row = conn.execute(insert(models).values(created_at=now, updated_at=now, **clean)
                               .returning(*models.c)).one()
    except IntegrityError as exc:
        raise Conflict(f"model already exists: {clean['model_name']}") from exc
    _invalidate(row.model_name)
    return public_view(row)


def update_model(conn: Connection, name: str, data: dict) -> dict:
    if not isinstance(data, dict):
        raise ValidationFailed("model must be a JSON object", [{"pointer": "", "message": "must be an object"}])
    data = dict(data)
    if data.get("model_name", name) != name:
        raise ValidationFailed("invalid model configuration",
                               [{"pointer": "/model_name", "message": "cannot be changed"}])
    data.pop("model_name", None)
    clean, errs = _check(data, partial=True)
    _check_types(conn, clean, errs)
    if errs:
        raise ValidationFailed("invalid model configuration", errs)
    if "head_msg" in clean:
        current = get_model_row(conn, name)
        if current is not None and clean["head_msg"] == redact(current.head_msg) and current.head_msg:
            # A view sent back (values shown as ***) keeps the stored secrets.
            del clean["head_msg"]
    row = conn.execute(update(models).where(models.c.model_name == name)
                       .values(updated_at=clock_now(), **clean).returning(*models.c)).first()
    if row is None:
        raise NotFound(f"model not found: {name}")
    _invalidate(name)
    return public_view(row)


def get_model_row(conn: Connection, name: str):
    return conn.execute(select(models).where(models.c.model_name == name)).first()


def get_model(conn: Connection, name: str) -> dict:
    row = get_model_row(conn, name)
    if row is None:
        raise NotFound(f"model not found: {name}")
    return public_view(row)


def require_enabled_model(conn: Connection, name: str):
    """The model a job is submitted to: unknown and disabled look the same."""
    row = get_model_row(conn, name)
    if row is None or not row.enabled:
        raise NotFound(f"model not found: {name}")
    return row


def enabled_model(name: str):
    """require_enabled_model through the per-process cache (admission path)."""
    row = _cache.get(name)
    if row is MISSING:
        with transaction() as conn:
            row = get_model_row(conn, name)
        _cache.set(name, row)
    if row is None or not row.enabled:
        raise NotFound(f"model not found: {name}")
    return row


def visible_models(conn: Connection, principal) -> list[dict]:
    """The models a key may see: admins all, other keys the enabled ones."""
    items = list_models(conn)
    return items if principal.is_admin else [m for m in items if m["enabled"]]


def list_models(conn: Connection) -> list[dict]:
    rows = conn.execute(select(models).order_by(models.c.model_name)).all()
    return [public_view(r) for r in rows]


def delete_model(conn: Connection, name: str) -> None:
    active = conn.execute(
        select(func.count()).select_from(tasks).where(
            tasks.c.model_name == name, tasks.c.state.in_([int(s) for s in ACTIVE_STATES]))
    ).scalar_one()
    if active:
        raise Conflict(f"model {name} has {active} active jobs; disable it and let them finish first")
    res = conn.execute(delete(models).where(models.c.model_name == name))
    _invalidate(name)
    if res.rowcount == 0:
        raise NotFound(f"model not found: {name}")
