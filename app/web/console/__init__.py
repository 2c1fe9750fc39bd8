"""The web console at /console: server-rendered page shells (Jinja) and one
small vanilla-JS file that calls the JSON API.

The API key lives in the tab's sessionStorage and goes out only as the
``Authorization: Bearer`` header of fetch() calls; no cookie ever grants
anything, so there is nothing for a cross-site request to ride on (no CSRF).
Pages carry a strict Content-Security-Policy (no inline script, no third
parties) and the JS builds the DOM with textContent only.
"""
from __future__ import annotations

from flask import Blueprint, Response, redirect, render_template, url_for

from app.web.contract import Ok, endpoint

bp = Blueprint("console", __name__, url_prefix="/console", template_folder="templates",
               static_folder="static", static_url_path="/static")

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


@bp.after_request
def _headers(resp):
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _page(name: str, title: str, **ctx) -> Response:
    return Response(render_template(f"{name}.html", page=name, title=title, **ctx), mimetype="text/html")


_HTML = Ok({"type": "string"}, "the page shell; its script calls the JSON API with the key from sessionStorage",
           media_type="text/html")


def page(summary: str):
    return endpoint(summary, tag="console", auth="none", ok=_HTML)


@bp.get("/")
@endpoint("The console: redirects to its models page", tag="console", auth="none",
          ok={302: Ok(description="to /console/models")})
def index():
    return redirect(url_for("console.models_page"))


@bp.get("/login")
@page('Console: log in with an API key')
def login_page():
    return _page("login", "Log in")


@bp.get("/models")
@page("Console: models with live queue/running numbers and the last hour's chart")
def models_page():
    return _page("models", "Models")


@bp.get("/models/edit")
@page('Console: create or edit a model (admins)')
def model_edit_page():
    return _page("model_edit", "Model")


@bp.get("/submit")
@page("Console: submit a job from the model's form")
def submit_page():
    return _page("submit", "Submit a job")


@bp.get("/jobs")
@page('Console: jobs, filtered by model, state, tenant and time')
def jobs_page():
    return _page("jobs", "Jobs")


@bp.get("/jobs/<job_id>")
@page('Console: a job, its timeline and its result')
def job_page(job_id: str):
    return _page("job", "Job", job_id=job_id)


@bp.get("/tenants")
@page("Console: a tenant's usage per day, queue share in use and rate-limit state")
def tenants_page():
    return _page("tenants", "Tenants")


@bp.get("/workers")
@page("Console: the workers, their liveness, heartbeat age and running jobs (admins)")
def workers_page():
    return _page("workers", "Workers")


@bp.get("/maintenance")
@page("Console: the beat leader, recent periodic runs and the gates against the rows (admins)")
def maintenance_page():
    return _page("maintenance", "Maintenance")
