"""The web console at /console: server-rendered page shells (Jinja) and one
small vanilla-JS file that calls the JSON API.

The API key lives in the tab's sessionStorage and goes out only as the
``Authorization: Bearer`` header of fetch() calls; no cookie ever grants
anything, so there is nothing for a cross-site request to ride on (no CSRF).
Pages carry a strict Content-Security-Policy (no inline script, no third
parties) and the JS builds the DOM with textContent only.
"""
from __future__ import annotations

from flask import Blueprint, redirect, render_template, url_for

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


def _page(name: str, title: str, **ctx):
    return render_template(f"{name}.html", page=name, title=title, **ctx)


@bp.get("/")
def index():
    return redirect(url_for("console.models_page"))


@bp.get("/login")
def login_page():
    return _page("login", "Log in")


@bp.get("/models")
def models_page():
    return _page("models", "Models")


@bp.get("/models/edit")
def model_edit_page():
    return _page("model_edit", "Model")


@bp.get("/submit")
def submit_page():
    return _page("submit", "Submit a job")


@bp.get("/jobs")
def jobs_page():
    return _page("jobs", "Jobs")


@bp.get("/jobs/<job_id>")
def job_page(job_id: str):
    return _page("job", "Job", job_id=job_id)
