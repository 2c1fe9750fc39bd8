"""``asynch submit`` / ``wait`` / ``stream`` / ``result`` / ``cancel``: the Python client
(model_asynch) from a shell, against a running API.

Where: ``--url`` / ASYNCH_URL and ``--key`` / ASYNCH_API_KEY; else the dev
stack running in this checkout (.asynch/dev.json: its URL and admin key,
app/cli/devstate.py); else http://127.0.0.1:8000 (and a key is needed).

Invariants: the commands only parse and render; every HTTP call, retry and
error is the client library's.  Output is the job's JSON on stdout (``result``:
the result's bytes).  Every failure is one line on stderr, ``Error: <cause>:
<next step>``, exit status 1, and no traceback unless ``--debug``.  An empty
key (``--key ""``, an empty ASYNCH_API_KEY) is an error, never a fallback.  A job is
named by its id alone (its model is looked up, ``GET /v1/jobs/{id}``) or, as
before, ``MODEL JOB_ID``.  ``wait`` exits 0 for done, 1 for
failed/timeout/canceled/expired, 2 when still running at its timeout.
A 429 or 503 the command retries is said before its wait, one line on
stderr (``queue full for demo-echo, retrying in 3 s (Retry-After)``), each
wait at most the client's ``max_backoff`` (30 s); a dropped connection's two
short retries (under 2 s in all) are not, so an API that is down is still
one line.
"""
from __future__ import annotations

import functools
import json
import os
import sys

import click
import requests

from app.cli import one_line
from app.cli.devstate import dev_client
from model_asynch import AsynchError, Client, Job, NotFinished, Retrying

DEFAULT_URL = "http://127.0.0.1:8000"
START = "start one with ./scripts/dev.sh, or pass --url / set ASYNCH_URL"

# The next step after an error answer, by status.
_NEXT = {401: "pass a valid key with --key or ASYNCH_API_KEY (./scripts/dev.sh prints the dev stack's admin key)",
         403: "this needs an admin key", 404: "check the model name and the job id (GET /v1/models, GET /v1/jobs)",
         409: "nothing was changed", 410: "the result was cleaned up: submit the job again",
         413: "send a smaller payload", 422: "fix the request (the model's form: GET /v1/models/MODEL)",
         429: "retry later"}


def _error_line(exc: Exception, url: str) -> str:
    if isinstance(exc, AsynchError):
        cause = one_line(exc.message, exc.errors)
        after = f" (after {exc.retry_after:g} s)" if exc.status == 429 and exc.retry_after else ""
        step = _NEXT.get(exc.status, "the server failed: see the API's log") + after
        if exc.status == 404 and exc.message.startswith("model disabled: "):
            step = f"an admin enables it: asynch models enable {exc.message.split(': ', 1)[1]}"
        return f"{cause} (HTTP {exc.status}): {step}"
    if isinstance(exc, requests.Timeout):
        return f"the API at {url} did not answer in time: is it overloaded? retry, or pass --url"
    if isinstance(exc, requests.ConnectionError):
        text = str(exc).lower()
        why = ("connection refused" if "refused" in text else
               "its host name does not resolve" if "resolve" in text or "name or service" in text else
               "connection failed")
        return f"cannot reach the API at {url} ({why}): is it running? {START}"
    if isinstance(exc, requests.RequestException):
        return f"bad API URL {url!r} ({type(exc).__name__}): pass --url http://host:port"
    return f"{type(exc).__name__}: {exc} (run again with --debug for the traceback)"


def client_command(fn):
    """A client command: --url, --key and --debug, the client made from them,
    and every failure turned into one line."""
    @click.option("--url", envvar="ASYNCH_URL", help=f"The API's base URL (env ASYNCH_URL; default: the dev stack "
                  f"running in this checkout, else {DEFAULT_URL}).")
    @click.option("--key", envvar=["ASYNCH_API_KEY", "ASYNCH_KEY"], help="An API key (env ASYNCH_API_KEY, or "
                  "ASYNCH_KEY; default: the admin key of the dev stack running in this checkout).")
    @click.option("--debug", is_flag=True, help="On an error, show the traceback too.")
    @functools.wraps(fn)
    def run(url: str | None, key: str | None, debug: bool, **kw):
        # An empty key is a mistake (--key "$UNSET"), never a reason to fall back to the dev admin key.
        # (click drops an empty environment value before we see it.)
        empty = [n for n in ("ASYNCH_API_KEY", "ASYNCH_KEY") if os.environ.get(n, None) == ""]
        if key is not None and not key.strip() or key is None and empty:
            where = "--key" if key is not None else " and ".join(empty)
            raise click.ClickException(f"empty key: {where} is set but empty; pass a key, or leave it out to use "
                                       "the dev stack's admin key")
        url, key = dev_client(url, key)
        url = url or DEFAULT_URL
        if not key:
            raise click.ClickException(f"no API key for {url}: pass --key or set ASYNCH_API_KEY "
                                       "(or run ./scripts/dev.sh in this checkout: its admin key is used)")
        try:
            # Two retries: a 429/503 or a dropped connection is retried (each wait said first), a
            # stopped API is said at once.
            with Client(url, key, retries=2, on_retry=_say_retry) as c:
                return fn(c, **kw)
        except (click.ClickException, click.exceptions.Exit):
            raise
        except Exception as exc:
            if debug:
                raise
            raise click.ClickException(_error_line(exc, url)) from None
    return run


def _say_retry(notice: Retrying) -> None:
    if isinstance(notice.error, AsynchError):  # an answer that asks us to wait, not a connection failure
        click.echo(str(notice), err=True)


def _show(job: Job) -> None:
    click.echo(json.dumps(dict(job.raw), indent=2, sort_keys=True))


def _payload(raw: str) -> dict:
    try:
        if raw == "-":
            raw = sys.stdin.read()
        elif raw.startswith("@"):
            with open(raw[1:], encoding="utf-8") as f:
                raw = f.read()
        data = json.loads(raw)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {raw[1:]}: {exc.strerror}", param_hint="PAYLOAD") from None
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="PAYLOAD") from None
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint="PAYLOAD")
    return data


def _job(c: Client, args: tuple[str, ...]) -> tuple[str, str]:
    """(model, job id) of ``JOB_ID`` or ``MODEL JOB_ID``."""
    if len(args) == 2:
        return args[0], args[1]
    if len(args) != 1:
        raise click.UsageError("name a job: JOB_ID (or MODEL JOB_ID)")
    return c.job(args[0]).model, args[0]


_JOB_ARGS = click.argument("job", nargs=-1, required=True, metavar="[MODEL] JOB_ID")


@click.command("submit", help="Submit a job: PAYLOAD is JSON, @file or - (stdin). Prints the job (JSON).")
@click.argument("model")
@click.argument("payload", default="{}")
@click.option("--wait", "wait_s", type=click.IntRange(1), help="Sync mode: wait up to N seconds for the end.")
@click.option("--priority", type=click.IntRange(0, 9), help="0-9, 9 first among your jobs (default 5).")
@click.option("--idempotency-key", help="Reuse to get the same job back (one is made per call otherwise).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the job id: JOB=$(asynch submit MODEL '{...}' -q).")
@click.option("--stream", "follow", is_flag=True, help="Then print its output as it comes (as `asynch stream "
              "--content`; the job id goes to stderr); exit 0 done, 1 otherwise.")
@client_command
def submit(c: Client, model: str, payload: str, wait_s: int | None, priority: int | None,
           idempotency_key: str | None, quiet: bool, follow: bool) -> None:
    job = c.submit(model, _payload(payload), wait=wait_s, priority=priority, idempotency_key=idempotency_key)
    if follow:
        click.echo(f"job {job.job_id}", err=True)
        sys.exit(_follow(c, model, job.job_id, "content"))
    click.echo(job.job_id) if quiet else _show(job)


@click.command("stream", help="Print a job's output as it comes (live while it runs, replayed after); exit 0 "
               "done, 1 failed/timeout/canceled/expired.")
@_JOB_ARGS
@click.option("--content", "shape", flag_value="content", help="Only the text of OpenAI-style chunks "
              "(choices[0].delta.content, or .text); other output as it is.")
@click.option("--json", "shape", flag_value="json", help="One JSON line per event: {id, event, data}.")
@click.option("--last-event-id", help="Resume after this event id.")
@client_command
def stream(c: Client, job: tuple[str, ...], shape: str | None, last_event_id: str | None) -> None:
    sys.exit(_follow(c, *_job(c, job), shape or "raw", last_event_id))


def _follow(c: Client, model: str, job_id: str, shape: str, last: str | None = None) -> int:
    """Print the job's output events (``raw``: the text as sent; ``content``: chunks' text; ``json``); the
    exit status of its end."""
    end = None
    for ev in c.stream(model, job_id, last):
        if shape == "json":
            click.echo(json.dumps({"id": ev.id, "event": ev.event, "data": ev.data}))
        elif ev.event == "output":
            sys.stdout.write(_content(ev.data) if shape == "content" else ev.data)
            sys.stdout.flush()
        if ev.id == "end":
            end = ev
    if shape == "content":
        click.echo()
    if end is not None and end.event != "done" and shape != "json":
        state = end.data.get("state") if isinstance(end.data, dict) else "?"
        error = end.data.get("error") if isinstance(end.data, dict) else None
        click.echo(f"job {job_id} ended {state}" + (f": {error}" if error else ""), err=True)
    return 0 if end is not None and end.event == "done" else 1


def _content(text: str) -> str:
    """The text an OpenAI-style chunk carries (SSE ``data: {...}`` or an NDJSON line); anything else as it is."""
    body = text.strip()
    body = body[5:].strip() if body.startswith("data:") else body
    if body == "[DONE]":
        return ""
    try:
        piece = json.loads(body)
        choice = piece["choices"][0]
        got = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
        return got if isinstance(got, str) else ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return text


@click.command("wait", help="Wait for a job's end and print it; exit 0 done, 1 failed/timeout/canceled/expired, "
               "2 still running at --timeout.")
@_JOB_ARGS
@click.option("--timeout", type=click.FloatRange(0), default=None, help="Give up after this many seconds "
              "(default: wait as long as it takes).")
@client_command
def wait(c: Client, job: tuple[str, ...], timeout: float | None) -> None:
    done = c.wait(*_job(c, job), timeout)
    _show(done)
    sys.exit(0 if done.state == "done" else 1 if done.finished else 2)


@click.command("result", help="Write a done job's result (the model's bytes) to stdout or --output.")
@_JOB_ARGS
@click.option("-o", "--output", type=click.File("wb"), default="-", help="Write it to this file [default: stdout].")
@client_command
def result(c: Client, job: tuple[str, ...], output) -> None:
    model, job_id = _job(c, job)
    try:
        body = c.result(model, job_id)
    except NotFinished as exc:  # 409: still running, or ended without a result (canceled, failed, ...)
        step = (f"wait for it: asynch wait {job_id}" if exc.message.startswith("job not finished") else
                f"only a done job has one: `asynch wait {job_id}` shows how it ended")
        raise click.ClickException(f"{exc.message} (HTTP 409): {step}") from None
    output.write(body.content)


@click.command("cancel", help="Cancel a job (yours) through the API and print it.")
@_JOB_ARGS
@client_command
def cancel(c: Client, job: tuple[str, ...]) -> None:
    _show(c.cancel(*_job(c, job)))
