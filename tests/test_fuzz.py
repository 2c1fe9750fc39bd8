"""Fuzzing: schemathesis against our own OpenAPI document (/openapi.json),
every operation, every check it has (`--checks all`: no 5xx, only
documented statuses, content types and schemas, negative data refused,
positive data accepted, 405 + Allow for undocumented methods, auth not
ignored, ...), over real HTTP to the API on a real socket with PostgreSQL and
Redis behind it.  Run twice: with an admin key and with a user key, on a few
seeded models, model types and jobs so paths with ids sometimes reach real
rows.

Bounded and reproducible: a fixed number of examples per operation, a fixed
seed, deterministic generation, no example database.  The number of
generated inputs is printed (docs/reliability.md quotes it).

No request leaves the machine: schemathesis talks to 127.0.0.1, no worker
runs during the fuzz (so no model call and no callback delivery happens), and
the API process resolves no host name (a fuzzed callbackUrl's host is looked
up by the SSRF guard; here only literal addresses and localhost resolve).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_lib
from sqlalchemy import text

from conftest import ROOT, make_key

pytestmark = pytest.mark.slow

MAX_EXAMPLES = int(os.environ.get("ASYNCH_FUZZ_EXAMPLES", "12"))

# Operations whose schema-valid input may still be refused with 422 because
# the answer depends on stored state the schema cannot express: a model's
# form (submissions), model type ids that must exist and unique form field
# names (model writes), a PUT body's model_name that must be the path's,
# a cursor that must be a job id, a from after a to.  Every other operation
# must accept every schema-valid input.
STATEFUL_422 = [
    ("POST", "^/v1/models/\\{model\\}/jobs$"), ("POST", "^/task/createTask$"),
    ("POST", "^/v1/models$"), ("PUT", "^/v1/models/\\{name\\}$"), ("PATCH", "^/v1/models/\\{name\\}$"),
    ("POST", "^/model/(createModel|updateModel)$"),
    ("GET", "^/v1/jobs$"), ("GET", "^/v1/models/\\{model\\}/jobs$"),
    ("GET", "^/v1/stats$"), ("GET", "^/stat/getModelStat$"),
    ("PUT", "^/v1/model-types/\\{type_id\\}$"), ("PATCH", "^/v1/model-types/\\{type_id\\}$"),
]


def _config(tmp: Path, dictionaries: dict[str, list], parameters: dict[str, str]) -> Path:
    """schemathesis.toml: seeded ids offered half of the time for the
    parameters that name stored things, and the operations above."""
    lines = ["# written by tests/test_fuzz.py"]
    for name, values in dictionaries.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}"]
    lines.append("[parameters]")
    lines += [f'"{key}" = {{ dictionary = "{name}", probability = 0.5 }}' for key, name in parameters.items()]
    for method, regex in STATEFUL_422:
        lines += ["[[operations]]", f"include-name-regex = '^{method} {regex[1:]}'",
                  'checks.positive_data_acceptance.expected-statuses = '
                  '["2xx", "3xx", "401", "403", "404", "409", "422", "429"]']
    path = tmp / "schemathesis.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _local_only_getaddrinfo(real):
    def fake(host, port, family=0, type=0, proto=0, flags=0):
        if host in ("localhost", "localhost."):
            host = "127.0.0.1"
        # AI_NUMERICHOST: literal addresses only (any spelling inet_aton takes), never a DNS query.
        return real(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)
    return fake


@pytest.fixture
def no_dns(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _local_only_getaddrinfo(socket.getaddrinfo))


@pytest.fixture
def short_waits(settings):
    """Long-polls end within a second here (the default 30 s budget would
    make every fuzzed /wait a 30 s request); conftest restores the settings."""
    from app.config import set_settings

    set_settings(settings.with_overrides(wait_default_ms=300, wait_max_ms=1000))


def _done(job_id: str, model: str) -> None:
    """Finish a pending job as a worker would (claim, store, complete)."""
    from datetime import timedelta

    from app import transitions
    from app.clock import now
    from app.db import transaction
    from app.services import callbacks
    from app.services.jobs import release_slot
    from app.storage import get_storage

    body = b'{"echo": "fuzz"}'
    with transaction() as conn:
        assert transitions.claim(conn, job_id, 0, now() + timedelta(hours=1)) is not None
        loc = get_storage().put(job_id, body, "application/json")
        row = transitions.complete(conn, job_id, 1, location=loc, content_type="application/json", size=len(body))
    release_slot(model, job_id)
    callbacks.schedule_for(row)  # a callback row to read back (no worker runs to deliver it)


@pytest.fixture
def seeded(make_model, settings):
    """Keys (ids far from 1, so a fuzzed DELETE /v1/keys/{id} does not
    revoke the keys the run uses), two models, a model type, and jobs of
    two tenants: pending and done."""
    from app.config import set_settings
    from app.db import get_engine, transaction
    from app.services import jobs, model_types
    from app.services.jobs import SubmitOptions
    from app.services.keys import Principal

    with get_engine().begin() as conn:
        conn.execute(text("ALTER SEQUENCE asynch_api_keys_id_seq RESTART WITH 1000000"))
    keys = {"admin": make_key("ops", admin=True), "user": make_key("tenant-a"), "other": make_key("tenant-b")}
    with transaction() as conn:
        model_types.create_type(conn, {"type_id": 1, "type_name": "chat"})
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
    broker = redis_lib.Redis.from_url(settings.effective_broker_url)
    for k in broker.scan_iter(f"*{settings.queue_name}*"):
        if not k.startswith(b"_kombu"):
            broker.delete(k)


def _run(api_url: str, key: str, config: Path, tmp: Path, label: str) -> tuple[int, str, dict]:
    report = tmp / f"schemathesis-{label}.json"
    argv = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
            f"{api_url}/openapi.json", "--checks", "all", "--max-examples", str(MAX_EXAMPLES),
            "--generation-deterministic", "--workers", "1", "--no-color",
            "--header", f"Authorization: Bearer {key}",
            "--report", "json", "--report-json-path", str(report), "--request-timeout", "30"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = proc.stdout + proc.stderr
    (tmp / f"schemathesis-{label}.txt").write_text(out)
    return proc.returncode, out, json.loads(report.read_text()) if report.exists() else {}


@pytest.mark.parametrize("who", ["admin", "user"])
def test_schemathesis_finds_nothing(api_url, seeded, short_waits, no_dns, tmp_path, who):
    keys, ids = seeded
    config = _config(tmp_path, {"jobs": ids, "models": ["echo", "free"], "tenants": ["tenant-a", "tenant-b", "ops"],
                                "types": [1]},
                     {"path.job_id": "jobs", "query.taskId": "jobs", "path.model": "models", "path.name": "models",
                      "query.modelName": "models", "path.tenant": "tenants", "query.tenant": "tenants",
                      "path.type_id": "types"})
    rc, out, report = _run(api_url, keys[who], config, tmp_path, who)
    summary = out[out.find("SUMMARY"):] if "SUMMARY" in out else out[-3000:]
    print(f"\nschemathesis ({who} key, {MAX_EXAMPLES} examples per operation):\n{summary}")
    assert rc == 0, f"schemathesis found failures with the {who} key:\n{out[-30000:]}"
