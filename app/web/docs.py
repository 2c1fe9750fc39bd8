"""GET /openapi.json: the OpenAPI 3.1 document of every route (no key needed)."""
from __future__ import annotations

from flask import Blueprint, jsonify

from app.web.openapi import document

bp = Blueprint("docs", __name__)


@bp.get("/openapi.json")
def openapi_json():
    return jsonify(document())
