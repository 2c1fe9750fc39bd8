"""GET /openapi.json: the OpenAPI 3.1 document of every route (no key needed)."""
from __future__ import annotations

from flask import Blueprint, current_app

from app.web.contract import Ok, endpoint
from app.web.openapi import document

bp = Blueprint("docs", __name__)


@bp.get("/openapi.json")
@endpoint("This document", tag="meta", auth="none", ok=Ok({"type": "object"}, "OpenAPI 3.1"))
def openapi_json():
    return document(current_app)
