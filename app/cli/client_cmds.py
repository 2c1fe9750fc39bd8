"""``asynch submit`` / ``asynch wait``: the Python client (model_asynch) from
a shell, against a running API (``--url``/ASYNCH_URL, ``--key``/ASYNCH_API_KEY).

Invariants: the commands only parse and render; every HTTP call, retry and
error is the client library's.  Output is the job's JSON on stdout; an
error answer is ``Error: <the API's error text>`` and exit status 1.  ``wait``
exits 0 for done, 1 for failed/timeout/canceled/expired, 2 when still running at
its timeout.
"""
from __future__ import annotations

import json
import sys

import click

from model_asynch import AsynchError, Client, Job

_URL = click.option("--url", envvar="ASYNCH_URL", default="http://127.0.0.1:8000", show_default=True,
                    help="the API's base URL (env ASYNCH_URL)")
_KEY = click.option("--key", envvar="ASYNCH_API_KEY", required=True, help="an API key (env ASYNCH_API_KEY)")


def _show(job: Job) -> None:
    out = dict(job.raw)
    click.echo(json.dumps(out, indent=2, sort_keys=True))


def _payload(raw: str) -> dict:
    if raw == "-":
        raw = sys.stdin.read()
    elif raw.startswith("@"):
        with open(raw[1:], encoding="utf-8") as f:
            raw = f.read()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="PAYLOAD") from None
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint="PAYLOAD")
    return data


def _fail(exc: AsynchError):
    extra = ("\n" + json.dumps(exc.errors, indent=2)) if exc.errors else ""
    raise click.ClickException(exc.message + extra)


@click.command("submit", help="Submit a job: PAYLOAD is JSON, @file or - (stdin). Prints the job.")
@click.argument("model")
@click.argument("payload", default="{}")
@click.option("--wait", "wait_s", type=click.IntRange(1), help="sync mode: wait up to N seconds for the end")
@click.option("--priority", type=click.IntRange(0, 9), help="0-9, 9 first among your jobs (default 5)")
@click.option("--idempotency-key", help="reuse to get the same job back (one is made per call otherwise)")
@_URL
@_KEY
def submit(model: str, payload: str, wait_s: int | None, priority: int | None, idempotency_key: str | None,
           url: str, key: str) -> None:
    with Client(url, key) as c:
        try:
            _show(c.submit(model, _payload(payload), wait=wait_s, priority=priority, idempotency_key=idempotency_key))
        except AsynchError as exc:
            _fail(exc)


@click.command("wait", help="Wait for a job's end; exit 0 done, 1 failed/timeout/canceled/expired, 2 still running.")
@click.argument("model")
@click.argument("job_id")
@click.option("--timeout", type=click.FloatRange(0), default=None, help="give up after this many seconds")
@_URL
@_KEY
def wait(model: str, job_id: str, timeout: float | None, url: str, key: str) -> None:
    with Client(url, key) as c:
        try:
            job = c.wait(model, job_id, timeout)
        except AsynchError as exc:
            _fail(exc)
    _show(job)
    sys.exit(0 if job.state == "done" else 1 if job.finished else 2)
