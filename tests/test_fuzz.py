"""Fuzzing: schemathesis against our own OpenAPI document (/openapi.json),
every operation, every check it has (`--checks all`: no 5xx, only
documented statuses, content types and schemas, negative data refused,
positive data accepted, 405 + Allow for undocumented methods, auth not
ignored, ...), over real HTTP to the API on a real socket with PostgreSQL and
Redis behind it.  Run twice: with an admin key and with a user key, on a few
seeded models, model types and jobs so paths with ids sometimes reach real
rows.  The user key tries the admin-only operations with a few examples only
(each must answer 403 whatever the input; the admin run covers them in full).

Bounded and reproducible: a fixed number of examples per operation, a fixed
seed, deterministic generation, no example database.  The number of
generated inputs is printed (docs/reliability.md quotes it).

No request leaves the machine: schemathesis talks to 127.0.0.1, no worker
runs during the fuzz (so no model call and no callback delivery happens), and
the API process resolves no host name (a fuzzed callbackUrl's host is looked
up by the SSRF guard; here only literal addresses and hosts-file names such
as localhost resolve, and DNS goes to a stub on 127.0.0.1 that knows no name).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import redis as redis_lib
from helpers import make_key
from sqlalchemy import text

pytestmark = pytest.mark.slow

MAX_EXAMPLES = int(os.environ.get("ASYNCH_FUZZ_EXAMPLES", "12"))
REFUSED_EXAMPLES = 3  # an admin-only operation under the user key: a 403 whatever the input

# A 422 on schema-valid input is excused only for the stateful rules that
# tests/fuzz_hooks.py declares (its check, only_stateful_422, reads the
# pointers of each such 422); the built-in check lets 422 through to it.
HOOKS = "fuzz_hooks"


def _config(tmp: Path, label: str, dictionaries: dict[str, list], parameters: dict[str, str],
            refused: list[str]) -> Path:
    """schemathesis.toml: MAX_EXAMPLES per operation; seeded ids offered half
    of the time for the parameters that name stored things; 422 on positive
    data goes to the hooks' narrower check.  ``refused``: the operations this
    key may not call, tried with REFUSED_EXAMPLES and no coverage phase (the
    admin run covers them in full; here each must only refuse)."""
    lines = ["# written by tests/test_fuzz.py", f"generation.max-examples = {MAX_EXAMPLES}"]
    for name, values in dictionaries.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}"]
    lines.append("[parameters]")
    lines += [f'"{key}" = {{ dictionary = "{name}", probability = 0.5 }}' for key, name in parameters.items()]
    lines += ["[checks.positive_data_acceptance]",
              'expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "422", "429"]']
    if refused:
        lines += ["[[operations]]", f"include-name = {json.dumps(refused)}",
                  f"generation.max-examples = {REFUSED_EXAMPLES}", "phases.coverage.enabled = false"]
    path = tmp / f"schemathesis-{label}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _admin_only(api_url: str) -> list[str]:
    """The operations the OpenAPI document marks x-admin-only, as schemathesis names them."""
    import requests

    paths = requests.get(f"{api_url}/openapi.json", timeout=30).json()["paths"]
    return sorted(f"{method.upper()} {path}" for path, ops in paths.items() for method, op in ops.items()
                  if isinstance(op, dict) and op.get("x-admin-only"))


def _local_only_getaddrinfo(real):
    def fake(host, port, family=0, type=0, proto=0, flags=0):
        if host in ("localhost", "localhost."):
            host = "127.0.0.1"
        # AI_NUMERICHOST: literal addresses only (any spelling inet_aton takes), never a DNS query.
        return real(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)
    return fake


@pytest.fixture
def no_dns(monkeypatch):
    """The system resolver takes literals only, and the URL checks' DNS
    (app/infra/http/resolver.py) asks a stub on 127.0.0.1 that knows no name."""
    from dns_stub import DnsStub

    from app.config import get_settings, set_settings

    monkeypatch.setattr(socket, "getaddrinfo", _local_only_getaddrinfo(socket.getaddrinfo))
    stub = DnsStub(nxdomain=True)
    set_settings(get_settings().with_overrides(resolve_nameservers=stub.address))
    yield
    stub.stop()


@pytest.fixture
def short_waits(settings):
    """Long-polls and event streams end within half a second here (the
    default budgets would make every fuzzed /wait a 30 s request and every
    event stream an hour's; a stream still polls and sends a keep-alive);
    conftest restores the settings."""
    from app.config import set_settings

    set_settings(settings.with_overrides(wait_default_ms=150, wait_max_ms=300, events_max_seconds=0.5,
                                         events_keepalive_seconds=0.2, events_poll_seconds=0.1))


def _done(job_id: str, model: str) -> None:
    """Finish a pending job as a worker would (claim, store, complete)."""
    from datetime import timedelta

    from app import transitions
    from app.clock import now
    from app.infra.db import transaction
    from app.infra.storage import get_storage
    from app.jobs import effects

    body = b'{"echo": "fuzz"}'
    with transaction() as conn:
        assert transitions.claim(conn, job_id, 0, now() + timedelta(hours=1)) is not None
        loc = get_storage().put(job_id, body, "application/json")
        row = transitions.complete(conn, job_id, 1, location=loc, content_type="application/json", size=len(body))
    effects.run(row)  # the slot back, and a callback row to read back (no worker runs to deliver it)


@pytest.fixture
def seeded(make_model, settings):
    """Keys (ids far from 1, so a fuzzed DELETE /v1/keys/{id} does not
    revoke the keys the run uses), two models, a model type, and jobs of
    two tenants: pending and done."""
    from app.catalog import model_types
    from app.catalog.schemas import ModelTypeInput
    from app.config import set_settings
    from app.infra.db import get_engine
    from app.jobs import service as jobs
    from app.jobs.service import SubmitOptions
    from app.tenancy.keys import Principal

    with get_engine().begin() as conn:
        conn.execute(text("ALTER SEQUENCE asynch_api_keys_id_seq RESTART WITH 1000000"))
    keys = {"admin": make_key("ops", admin=True), "user": make_key("tenant-a"), "other": make_key("tenant-b")}
    model_types.create_type(ModelTypeInput(**{"type_id": 1, "type_name": "chat"}))
    make_model("echo", form=[{"field": "prompt", "type": "string", "required": True}], queue_limit=1000)
    make_model("free", queue_limit=1000, models_type="1")
    ids = []
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1"))  # for the seeded callback only
    for tenant in ("tenant-a", "tenant-b"):
        p = Principal(tenant, "user", None)
        ids += [jobs.submit(p, m, body, SubmitOptions(callback_url=cb)).row.id
                for m, body, cb in (("echo", {"prompt": "a"}, None), ("free", {"x": 1}, "http://127.0.0.1:9/cb"),
                                    ("free", {}, None))]
    _done(ids[1], "free")
    _done(ids[4], "free")
    set_settings(settings)
    yield keys, ids
    # Doorbells published by fuzzed submissions: no worker of this session may run them later.
    from app.jobs import handoff

    handoff.flush()
    broker = redis_lib.Redis.from_url(settings.effective_broker_url)
    for k in broker.scan_iter(f"*{settings.queue_name}*"):
        if not k.startswith(b"_kombu"):
            broker.delete(k)


def _run(api_url: str, key: str, config: Path, tmp: Path, label: str) -> tuple[int, str, dict]:
    report = tmp / f"schemathesis-{label}.json"
    argv = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
            f"{api_url}/openapi.json", "--checks", "all",
            "--generation-deterministic", "--workers", "1", "--no-color",
            "--header", f"Authorization: Bearer {key}",
            "--report", "json", "--report-json-path", str(report), "--request-timeout", "30"]
    # cwd: schemathesis keeps a crash cache in .schemathesis/ of its working directory.
    env = {**os.environ, "SCHEMATHESIS_HOOKS": HOOKS, "FUZZ_422_LOG": str(tmp / f"excused-422-{label}.tsv"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    out = proc.stdout + proc.stderr
    (tmp / f"schemathesis-{label}.txt").write_text(out)
    return proc.returncode, out, json.loads(report.read_text()) if report.exists() else {}


@pytest.mark.timeout(700)  # the run's own bound is 600 s (a loaded machine's run takes 2-3x the quiet 80 s)
@pytest.mark.parametrize("who", ["admin", "user"])
def test_schemathesis_finds_nothing(api_url, seeded, short_waits, no_dns, tmp_path, who):
    keys, ids = seeded
    config = _config(tmp_path, who, {"jobs": ids, "models": ["echo", "free"], "tenants": ["tenant-a", "tenant-b", "ops"],
                                "types": [1]},
                     {"path.job_id": "jobs", "query.taskId": "jobs", "path.model": "models", "path.name": "models",
                      "query.modelName": "models", "path.tenant": "tenants", "query.tenant": "tenants",
                      "path.type_id": "types"},
                     _admin_only(api_url) if who == "user" else [])
    from app.config import get_settings, set_settings

    # One address sends every case, many of them without a key on purpose
    # (a 401 expected): the per-address anonymous limit (tests/test_anonymous.py)
    # would turn those into 429s.  The contract is what is fuzzed here.
    # The seed-000 routes (POST /jobs ...) serve a seeded model, so they are fuzzed as served, not as off.
    set_settings(get_settings().with_overrides(anon_rate_limit_per_second=0.0, seed000_model="free"))
    rc, out, report = _run(api_url, keys[who], config, tmp_path, who)
    assert rc == 0, f"schemathesis found failures with the {who} key:\n{out[-30000:]}"
    ops, cases = report["operations"], report["test_cases"]
    # The figures docs/reliability.md quotes (pytest -s shows them).
    phases = ", ".join(f"{k}={v['status']}" for k, v in report["phases"].items())
    print(f"\nFUZZ {who} key: {ops['tested']}/{ops['total']} operations, {cases['generated']} generated inputs "
          f"({MAX_EXAMPLES} examples per operation), {cases['with_failures']} failing, phases {phases}")
    excused = tmp_path / f"excused-422-{who}.tsv"
    for line, n in sorted(Counter(excused.read_text().splitlines() if excused.exists() else []).items()):
        print(f"  excused 422 x{n}: {line}")
    assert ops["tested"] == ops["total"] > 0 and cases["generated"] > 0 and cases["with_failures"] == 0
    assert all(p["status"] in ("success", "skip") for p in report["phases"].values())


# --- what the fuzzer found, pinned: each was a 500 (or a wrong acceptance) --------------

def _seed_envelope_ok(resp) -> dict:
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()["data"]


def test_nul_in_a_path_query_or_body_is_refused_not_a_500(client, make_model, admin_key, user_key):
    from helpers import auth

    make_model("echo")
    h, a = auth(user_key), auth(admin_key)
    assert client.get("/v1/models/ec%00ho/jobs/job_x", headers=h).status_code == 404
    assert client.get("/v1/models/ec%00ho", headers=h).status_code == 404
    nul_path = client.get("/task/getTaskResult%00", headers=h)
    assert nul_path.status_code == 404 and nul_path.get_json()["code"] == 404  # the seed's envelope
    q = client.get("/v1/jobs?cursor=a%00b", headers=h)
    assert q.status_code == 422 and q.get_json()["errors"] == [{"pointer": "/cursor",
                                                                 "message": "must not contain NUL characters"}]
    seed_q = client.get("/task/getTaskResult?taskId=job_%00", headers=h)
    assert seed_q.status_code == 422 and seed_q.get_json()["errors"][0]["pointer"] == "/taskId"
    name = client.post("/task/createTask", json={"modelName": "echo\x00", "requestPayload": {}}, headers=h)
    assert name.status_code == 422 and name.get_json()["errors"][0]["pointer"] == "/modelName"
    form = client.post("/v1/models", json={"model_name": "m", "base_url": "http://127.0.0.1:1",
                                           "form": [{"field": "f", "hint": "\x00"}]}, headers=a)
    assert form.status_code == 422 and form.get_json()["errors"][0]["pointer"] == "/form/0/hint"
    batch = client.post("/task/getTaskBatch", json={"taskIds": ["job_\x00"]}, headers=h)
    assert batch.status_code == 422 and batch.get_json()["errors"][0]["pointer"] == "/taskIds/0"
    with_nul_in_ignored_body = client.post("/task/runWork", data=b'{"x": "\\u0000"}', headers=a,
                                           content_type="application/json")
    assert with_nul_in_ignored_body.status_code == 200
    assert job_count() == 0
    # A job's payload is data for the model: stored as JSON text (NUL escaped), so it may carry NUL.
    v1 = client.post("/v1/models/echo/jobs", data=b'{"a": {"b": ["x\\u0000"]}}', headers=h,
                     content_type="application/json")
    assert v1.status_code == 202
    for payload in ({"p": "\x00"}, '{"p": "\\u0000"}'):
        seed = client.post("/task/createTask", json={"modelName": "echo", "requestPayload": payload}, headers=h)
        assert seed.status_code == 200, seed.get_data(as_text=True)
    assert job_count() == 3


def job_count() -> int:
    from sqlalchemy import func, select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks)).scalar_one()


def test_bodies_json_cannot_carry_are_400(client, make_model, user_key):
    from helpers import auth

    make_model("echo")
    h = auth(user_key)
    for raw in (b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": "\\ud800"}', b'{"a": "x\\udc00"}',
                b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
        resp = client.post("/v1/models/echo/jobs", data=raw, headers=h, content_type="application/json")
        assert resp.status_code == 400, (raw[:30], resp.status_code)
    paired = client.post("/v1/models/echo/jobs", data=b'{"a": "\\ud83d\\ude00"}', headers=h,
                         content_type="application/json")
    assert paired.status_code == 202  # a surrogate pair is an ordinary character
    seeded = client.post("/task/createTask", json={"modelName": "echo", "requestPayload": '{"a": NaN}'}, headers=h)
    assert seeded.status_code == 422 and seeded.get_json()["errors"][0]["pointer"] == "/requestPayload"
    assert job_count() == 1


def test_model_fields_the_database_could_not_take_are_422(client, admin_key):
    from helpers import auth

    a = auth(admin_key)
    base = {"model_name": "m", "base_url": "http://127.0.0.1:1"}
    cases = {
        "/base_url": {"base_url": "http://[::1"},                       # urlparse raised ValueError
        "/route": {"route": "/" + "r" * 1024},                         # longer than the column
        "/models_type": {"models_type": ",".join(["1"] * 300)},         # 599 characters
        "/form/0/type": {"form": [{"field": "f", "type": {}}]},         # unhashable: TypeError
        "/form/0/pattern": {"form": [{"field": "f", "pattern": "a{99999999999}"}]},
        "/model_name": {"model_name": "m\n"},                           # "$" took the final newline
    }
    for pointer, fields in cases.items():
        resp = client.post("/v1/models", json={**base, **fields}, headers=a)
        assert resp.status_code == 422, (pointer, resp.status_code, resp.get_data(as_text=True)[:200])
        assert pointer in [e["pointer"] for e in resp.get_json()["errors"]]
    assert client.post("/v1/keys", json={"tenant": "t\n"}, headers=a).status_code == 422
    assert client.post("/v1/keys", json={"tenant": "t", "admin": "yes"}, headers=a).status_code == 422
    assert client.get("/v1/models", headers=a).get_json()["models"] == []
    # JSON has one number type: 2.0 is the integer 2 (as JSON Schema says).
    ok = client.post("/v1/models", json={**base, "retry_times": 2.0, "queue_limit": 5.0, "enabled": 1.0}, headers=a)
    assert ok.status_code == 201 and ok.get_json()["retry_times"] == 2 and ok.get_json()["queue_limit"] == 5
    assert client.post("/v1/models", json={**base, "model_name": "n", "retry_times": 2.5},
                       headers=a).status_code == 422


def test_model_type_ids_past_the_column_are_not_allocated(client, admin_key):
    from helpers import auth

    a = auth(admin_key)
    assert client.post("/v1/model-types", json={"type_id": 2**31 - 1, "type_name": "top"}, headers=a).status_code == 201
    nxt = client.post("/v1/model-types", json={"type_name": "next"}, headers=a)
    assert nxt.status_code == 201 and nxt.get_json()["type_id"] == 1  # max + 1 would not fit: the lowest free
    assert client.post("/v1/model-types", json={"type_name": "again"}, headers=a).get_json()["type_id"] == 2
    moved = client.put("/v1/model-types/1", json={"type_id": 7, "type_name": "x"}, headers=a)
    assert moved.status_code == 422 and moved.get_json()["errors"][0]["pointer"] == "/type_id"


def test_listing_times_with_any_offset_or_year(client, user_key):
    from helpers import auth

    h = auth(user_key)
    assert client.get("/v1/jobs?until=0042-04-21T23:33:18-16:02", headers=h).status_code == 200
    for bad in ("0001-01-01T00:00:00%2B05:00", "9999-12-31T23:00:00-05:00"):
        resp = client.get(f"/v1/jobs?since={bad}", headers=h)
        assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/since"


def test_percent_signs_in_a_submission_are_data_not_placeholders(client, make_model, user_key):
    """The group-committed INSERT is rendered by the driver and sent as text:
    a "%s" in a header or a payload once raised TypeError there (a 500)."""
    from helpers import auth

    make_model("free", queue_limit=1000)
    h = {**auth(user_key), "X-Oss-Authorization": "Bearer %s%(x)s%", "Idempotency-Key": "k%s"}
    seed = client.post("/task/createTask", json={"modelName": "free", "bizName": "b%d",
                                                 "requestPayload": {"p": "%s %(a)s %%"}}, headers=h)
    task_id = _seed_envelope_ok(seed)["task_id"]
    v1 = client.post("/v1/models/free/jobs", json={"q": "100%"}, headers={**auth(user_key), "X-Biz-Name": "%s"})
    assert v1.status_code == 202, v1.get_data(as_text=True)
    from app.infra.db import transaction
    from app.infra.tables import tasks
    from sqlalchemy import select

    with transaction() as conn:
        row = conn.execute(select(tasks).where(tasks.c.id == task_id)).one()
    assert json.loads(row.request_payload) == {"p": "%s %(a)s %%"} and row.biz_name == "b%d" and row.idempotency_key == "k%s"
    assert job_count() == 2


def test_a_tenant_rate_too_small_for_the_bucket_is_refused(client, admin_key, user_key, make_model):
    """A rate of 7e-162/s was stored, and then every request of that tenant
    raised ValueError building its bucket (a 500 on every route)."""
    from helpers import auth

    make_model("echo")
    for rate in (7.3e-162, 0.001):
        resp = client.put("/v1/tenants/tenant-a/limits", json={"rate_per_second": rate, "burst": 1},
                          headers=auth(admin_key))
        assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/rate_per_second", \
            resp.get_data(as_text=True)
    assert client.get("/v1/jobs", headers=auth(user_key)).status_code == 200
    ok = client.put("/v1/tenants/tenant-a/limits", json={"rate_per_second": 0.01, "burst": 10_000_000},
                    headers=auth(admin_key))
    assert ok.status_code == 200, ok.get_data(as_text=True)
    assert client.get("/v1/jobs", headers=auth(user_key)).status_code == 200
