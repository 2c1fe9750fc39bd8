"""The web console at /console: Jinja page shells and one vanilla-JS file
that calls the JSON API.  The API key lives in the tab's sessionStorage and
goes out only as the Authorization header of fetch() calls; no cookie grants
anything (no CSRF).  Pages carry a strict Content-Security-Policy (no inline
script, no third parties); the JS builds the DOM with textContent only.
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
    resp.headers.update({"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                         "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})
    return resp


_HTML = Ok({"type": "string"}, "the page shell; its script calls the JSON API with the key from sessionStorage",
           media_type="text/html")


@bp.get("/")
@endpoint("The console: redirects to its models page", tag="console", auth="none",
          ok={302: Ok(description="to /console/models")})
def index():
    return redirect(url_for("console.models_page"))


# The page shells: (template, path, title, summary); each is the route
# ``console.<template>_page`` (the templates' url_for names).
_PAGES = (
    ("login", "/login", "Log in", "Console: log in with an API key"),
    ("models", "/models", "Models", "Console: models with live queue/running numbers and the last hour's chart"),
    ("model_edit", "/models/edit", "Model", "Console: create or edit a model (admins)"),
    ("submit", "/submit", "Submit a job", "Console: submit a job from the model's form"),
    ("jobs", "/jobs", "Jobs", "Console: jobs, filtered by model, state, tenant and time"),
    ("job", "/jobs/<job_id>", "Job", "Console: a job, its timeline and its result"),
    ("batches", "/batches", "Batches", "Console: the tenant's batches, their progress, counts and files"),
    ("tenants", "/tenants", "Tenants", "Console: a tenant's usage per day, queue share in use and rate-limit state"),
    ("workers", "/workers", "Workers", "Console: the workers, their liveness, heartbeat age and running jobs (admins)"),
    ("maintenance", "/maintenance", "Maintenance",
     "Console: the beat leader, recent periodic runs and the gates against the rows (admins)"),
)


def _add_page(name: str, path: str, title: str, summary: str) -> None:
    def view(**path_args) -> Response:
        return Response(render_template(f"{name}.html", page=name, title=title, **path_args), mimetype="text/html")

    view.__name__ = f"{name}_page"
    bp.add_url_rule(path, view.__name__, endpoint(summary, tag="console", auth="none", ok=_HTML)(view), methods=["GET"])


for _spec in _PAGES:
    _add_page(*_spec)
