"""GET /openapi.json: the OpenAPI 3.1 document of every route (no key needed).

Served from the one document built per process (app/web/openapi.py
``served``), with a strong ETag: a client that sends it back in
If-None-Match gets a 304 and no body."""
from __future__ import annotations

from flask import Blueprint, Response, current_app, request

from app.web.contract import Ok, endpoint
from app.web.openapi import served

bp = Blueprint("docs", __name__)


@bp.get("/openapi.json")
@endpoint("This document", tag="meta", auth="none",
          ok={200: Ok({"type": "object"}, "OpenAPI 3.1", {"ETag": "the document's strong validator"}),
              304: Ok(None, "If-None-Match names the current ETag", {"ETag": "the document's strong validator"})})
def openapi_json():
    body, etag = served(current_app)
    headers = {"ETag": f'"{etag}"', "Cache-Control": "no-cache"}
    if request.if_none_match.contains_weak(etag):  # RFC 9110 13.1.2: weak comparison
        return Response(status=304, headers=headers)
    return Response(body, status=200, mimetype="application/json", headers=headers)
