"""Issue 21, item 8 and two of item 9: deployment secrets, `asynch env`, the worker metrics port.

- deploy/ and docker-compose.yml carry no secret and no default for one:
  compose requires each (${VAR:?}), Kubernetes reads them from Secrets the
  operator creates with the command docs/operations.md shows;
- outside dev mode the startup check refuses a placeholder, an empty
  secrets key, an empty metrics token and a low-entropy bootstrap key, one
  line per refusal naming the variable (the old k8s values passed it);
- `asynch env` masks every secret and every URL's password;
- a worker node's metrics port binds 127.0.0.1 by default, and half-sent
  requests hold at most ASYNCH_WORKER_METRICS_MAX_CONNECTIONS threads, each
  closed after ASYNCH_WORKER_METRICS_TIMEOUT_SECONDS.
"""
from __future__ import annotations

import re
import select
import socket
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml
from click.testing import CliRunner
from helpers import ROOT, WorkerProcess, free_port, wait_until
from test_compose import INTERPOLATION
from test_k8s import _load, documented_secret

from app.cli import main as cli_main
from app.config import Settings, load_settings, set_settings
from app.infra import metrics, metrics_server
from app.infra.secretbox import new_key
from app.secret_settings import NOT_SECRETS, SECRET_LOOKING, SECRETS, check_startup, is_placeholder

STRONG = {"key_pepper": "pQ7xR2vL9mK4wN8sT1yB6cF3hJ5dG0aZ", "bootstrap_admin_key": "bV3nM8qW2eR7tY1uI6oP4aS9dF5gH0jK",
          "secrets_keys": new_key(), "metrics_token": "mZ4xC9vB2nM7aS1dF6gH3jK8lQ5wE0rT", "dev_mode": False}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|PEPPER|TOKEN|_KEY\b|_KEYS\b|USERLIST")


# --- item 8: no secret in the deployment files -------------------------------------------------

def test_compose_has_no_default_for_any_secret():
    text = (ROOT / "docker-compose.yml").read_text()
    secret_refs = [m for m in INTERPOLATION.finditer(text) if SECRET_NAME.search(m.group(1))]
    assert {m.group(1) for m in secret_refs} >= {"POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD", "ASYNCH_KEY_PEPPER",
                                                 "ASYNCH_BOOTSTRAP_ADMIN_KEY", "ASYNCH_SECRETS_KEYS",
                                                 "ASYNCH_METRICS_TOKEN"}
    defaulted = [m.group(0) for m in secret_refs if m.group(2) != ":?"]
    assert not defaulted, f"secrets with a default (use ${{VAR:?message}}): {defaulted}"
    compose = yaml.safe_load(text)
    envs = [compose["x-asynch-env"]] + [s.get("environment") or {} for s in compose["services"].values()]
    for env in envs:
        for var, value in env.items():
            if SECRET_NAME.search(var):
                assert INTERPOLATION.fullmatch(str(value)) or INTERPOLATION.search(str(value)), \
                    f"{var}: a literal secret in docker-compose.yml: {value!r}"
    assert not re.search(r"change-?me", text, re.I)


def test_k8s_ships_no_secret_and_reads_them_from_secrets_the_operator_creates():
    docs = _load() + [d for d in yaml.safe_load_all((ROOT / "deploy/k8s/workerless/cronjobs.yaml").read_text()) if d]
    assert not [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"]
    text = "".join(p.read_text() for p in (ROOT / "deploy").rglob("*.yaml"))
    assert not re.search(r"change-?me", text, re.I)
    cfg = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "asynch-config")["data"]
    leaked = [k for k in cfg if SECRET_NAME.search(k) or k == "ASYNCH_DATABASE_URL"]
    assert not leaked, f"secrets in the ConfigMap: {leaked}"

    # Every pod takes them from the Secrets (no value, no optional: a missing Secret stops the pod).
    refs = set()
    for d in docs:
        spec = d.get("spec", {})
        pod = spec.get("template", spec.get("jobTemplate", {}).get("spec", {}).get("template", {})).get("spec", {})
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            for r in c.get("envFrom", []):
                if "secretRef" in r:
                    assert not r["secretRef"].get("optional"), d["metadata"]["name"]
                    refs.add((r["secretRef"]["name"], None))
            for e in c.get("env", []):
                assert not (SECRET_NAME.search(e["name"]) and "value" in e), f"{e['name']}: a literal secret"
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
    assert {name for name, _ in refs} == {"asynch-secrets", "pgbouncer-secrets"}

    # The documented commands create what the pods read, and with the
    # ConfigMap it makes settings that pass the startup check; without them it does not.
    ours = documented_secret("asynch-secrets")
    assert {"ASYNCH_DATABASE_URL", "ASYNCH_KEY_PEPPER", "ASYNCH_BOOTSTRAP_ADMIN_KEY", "ASYNCH_SECRETS_KEYS",
            "ASYNCH_METRICS_TOKEN", "ASYNCH_S3_SECRET_KEY"} <= set(ours)
    bouncer = documented_secret("pgbouncer-secrets")
    assert {key for name, key in refs if name == "pgbouncer-secrets"} == set(bouncer)
    assert "$DB_PASSWORD" in ours["ASYNCH_DATABASE_URL"] and "$DB_PASSWORD" in bouncer["PGBOUNCER_USERLIST"]
    generated = {"ASYNCH_DATABASE_URL": "postgresql+psycopg2://asynch:Zq81xV0e@pgbouncer:6432/asynch",
                 "ASYNCH_KEY_PEPPER": STRONG["key_pepper"], "ASYNCH_BOOTSTRAP_ADMIN_KEY": STRONG["bootstrap_admin_key"],
                 "ASYNCH_SECRETS_KEYS": STRONG["secrets_keys"], "ASYNCH_METRICS_TOKEN": STRONG["metrics_token"],
                 "ASYNCH_S3_ACCESS_KEY": "AKIA5X", "ASYNCH_S3_SECRET_KEY": "wJ9xR2vL7mK4"}
    assert set(generated) == set(ours)
    check_startup(load_settings({**cfg, **generated}))
    with pytest.raises(ValueError):
        check_startup(load_settings(cfg))


# --- item 8: the startup check -----------------------------------------------------------------

@pytest.mark.parametrize("change, variable", [
    ({"key_pepper": "change-me-pepper"}, "ASYNCH_KEY_PEPPER"),
    ({"key_pepper": "CHANGEME_please_0192837465"}, "ASYNCH_KEY_PEPPER"),
    ({"secrets_keys": ""}, "ASYNCH_SECRETS_KEYS"),
    ({"secrets_keys": "not-a-fernet-key"}, "ASYNCH_SECRETS_KEYS"),
    ({"metrics_token": ""}, "ASYNCH_METRICS_TOKEN"),
    ({"metrics_token": "my-metrics-Secret-9876543210"}, "ASYNCH_METRICS_TOKEN"),
    ({"bootstrap_admin_key": "a" * 32}, "ASYNCH_BOOTSTRAP_ADMIN_KEY"),
    ({"bootstrap_admin_key": "abcdefghi" * 4}, "ASYNCH_BOOTSTRAP_ADMIN_KEY"),  # 9 distinct characters
    ({"bootstrap_admin_key": "Zx81"}, "ASYNCH_BOOTSTRAP_ADMIN_KEY"),
    ({"gateway_secret": "example-gateway-token-1234"}, "ASYNCH_GATEWAY_SECRET"),
    ({"s3_secret_key": "minio-password"}, "ASYNCH_S3_SECRET_KEY"),
    ({"database_url": "postgresql+psycopg2://asynch:change-me@pgbouncer:6432/asynch"}, "ASYNCH_DATABASE_URL"),
    ({"redis_url": "redis://:Placeholder@redis:6379/0"}, "ASYNCH_REDIS_URL"),
])
def test_outside_dev_mode_a_placeholder_or_weak_secret_is_refused_in_one_line(change, variable):
    check_startup(Settings(**STRONG))  # the base passes
    s = Settings(**{**STRONG, **change})
    with pytest.raises(ValueError) as err:
        check_startup(s)
    (line,) = err.value.args[0].splitlines()[1:]  # exactly one refusal, on its own line
    assert line.strip().startswith(variable) and ":" in line, line
    if variable == "ASYNCH_BOOTSTRAP_ADMIN_KEY" and len(change[variable.lower()[7:]]) >= 32:
        assert "distinct characters" in line
    check_startup(s.with_overrides(dev_mode=True))  # dev mode starts with anything


def test_the_values_deploy_k8s_shipped_are_refused_each_on_its_line():
    """Before: ASYNCH_KEY_PEPPER=change-me-pepper, empty secrets key and metrics token all passed."""
    s = load_settings({"ASYNCH_DATABASE_URL": "postgresql+psycopg2://asynch:change-me@pgbouncer:6432/asynch",
                       "ASYNCH_KEY_PEPPER": "change-me-pepper", "ASYNCH_BOOTSTRAP_ADMIN_KEY": "",
                       "ASYNCH_SECRETS_KEYS": "", "ASYNCH_METRICS_TOKEN": "", "ASYNCH_S3_SECRET_KEY": "change-me"})
    with pytest.raises(ValueError) as err:
        check_startup(s)
    lines = err.value.args[0].splitlines()[1:]
    assert sorted(ln.split()[0] for ln in lines) == sorted([
        "ASYNCH_KEY_PEPPER", "ASYNCH_SECRETS_KEYS", "ASYNCH_METRICS_TOKEN", "ASYNCH_S3_SECRET_KEY",
        "ASYNCH_DATABASE_URL"])
    # A server command prints them and does not start.
    set_settings(s)
    out = CliRunner().invoke(cli_main, ["worker"])
    assert out.exit_code != 0 and all(ln.strip() in out.output for ln in lines), out.output


def test_an_upgrade_from_the_derived_key_lists_it_after_a_new_one(settings):
    """A deployment that ran without ASYNCH_SECRETS_KEYS (now refused) keeps
    its stored secrets readable: `asynch secrets derived-key` after a new key."""
    from app.infra import secretbox

    set_settings(settings.with_overrides(secrets_keys=""))
    stored = secretbox.encrypt("API_KEY:model-s3cret")
    out = CliRunner().invoke(cli_main, ["secrets", "derived-key"])
    assert out.exit_code == 0, out.output
    set_settings(settings.with_overrides(secrets_keys=f"{new_key()},{out.output.strip()}"))
    assert secretbox.decrypt(stored) == "API_KEY:model-s3cret"


def test_placeholders_are_words_not_chance():
    assert is_placeholder("Change_Me") and is_placeholder("my.PASSWORD") and is_placeholder("REPLACE-ME")
    assert not is_placeholder(STRONG["key_pepper"]) and not is_placeholder(new_key())


# --- item 9: `asynch env` ---------------------------------------------------------------------

def test_asynch_env_masks_every_secret_and_every_url_password(settings):
    secrets = {"key_pepper": "pepper-Q1", "bootstrap_admin_key": "boot-W2", "secrets_keys": "fernet-E3",
               "gateway_secret": "gateway-R4", "metrics_token": "metrics-T5", "s3_secret_key": "s3-Y6",
               "oss_authorization": "Bearer oss-U7"}
    urls = {"database_url": ("postgresql+psycopg2://asynch:db-I8@pg:5432/asynch", "asynch:***@pg:5432/asynch"),
            "redis_url": ("redis://:redis-O9@127.0.0.1:6379/15", "redis://:***@127.0.0.1:6379/15"),
            "broker_url": ("amqp://user:broker-P0@rabbit:5672//", "amqp://user:***@rabbit:5672//"),
            "storage_url": ("oss+https://me:oss-A1@files.internal/base", "oss+https://me:***@files.internal/base"),
            "s3_endpoint_url": ("https://s3:ep-S2@minio:9000", "https://s3:***@minio:9000")}
    set_settings(settings.with_overrides(**secrets, **{k: v for k, (v, _) in urls.items()}))
    out = CliRunner().invoke(cli_main, ["env"])
    assert out.exit_code == 0, out.output
    for leaked in list(secrets.values()) + ["db-I8", "redis-O9", "broker-P0", "oss-A1", "ep-S2"]:
        assert leaked.split()[-1] not in out.output, leaked
    for name in secrets:
        assert f"ASYNCH_{name.upper()}=***\n" in out.output
    for name, (_, shown) in urls.items():
        assert shown in out.output, name
    assert "ASYNCH_GATEWAY_SECRET_HEADER=X-Gateway-Secret" in out.output  # not a secret: shown


def test_every_secret_looking_setting_is_classified():
    """A new setting named like a secret must be put in SECRETS (masked,
    placeholder-checked) or NOT_SECRETS (app/secret_settings.py)."""
    looking = {n for n in Settings.model_fields if SECRET_LOOKING.search(n)}
    assert looking <= SECRETS | NOT_SECRETS, sorted(looking - SECRETS - NOT_SECRETS)
    assert SECRETS <= set(Settings.model_fields)


# --- item 9: the worker metrics port ------------------------------------------------------------

TOKEN = "mZ4xC9vB2nM7aS1dF6gH3jK8lQ5wE0rT"


@pytest.fixture
def node_port(settings):
    set_settings(settings.with_overrides(metrics_token=TOKEN, worker_metrics_timeout_seconds=1.0,
                                         worker_metrics_max_connections=4))
    port = free_port()
    server = metrics_server.serve_node(port)
    assert server is not None
    yield server, port
    server.shutdown()
    server.server_close()
    metrics_server._node_server = None


def _handler_threads() -> int:
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_the_default_bind_is_loopback(settings):
    assert Settings().worker_metrics_bind == "127.0.0.1"
    port = free_port()
    server = metrics_server.serve_node(port)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
        metrics_server._node_server = None


def test_a_worker_node_listens_on_loopback_only(test_env, tmp_path):
    """What `asynch worker` starts: its metrics port is on 127.0.0.1, not every interface."""
    port = free_port()
    env = {**test_env, **metrics.group_env(str(tmp_path / "metrics")), "ASYNCH_WORKER_METRICS_PORT": str(port)}
    node = WorkerProcess(env, concurrency=1, log_path=tmp_path / "w.log", name="bind").start()
    try:
        def listening():
            return [ln.split()[1] for ln in Path("/proc/net/tcp").read_text().splitlines()[1:]
                    if int(ln.split()[1].split(":")[1], 16) == port and ln.split()[3] == "0A"]
        assert wait_until(listening, timeout=20, what="the node's metrics port") == ["0100007F:%04X" % port]
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).text == "ok\n"
    finally:
        node.stop()


def test_half_sent_requests_hold_a_bounded_number_of_threads_and_are_closed(node_port):
    server, port = node_port
    before = _handler_threads()
    clients = []
    try:
        for _ in range(300):
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never the blank line
            clients.append(c)
        grown = _handler_threads() - before
        assert grown <= 4, f"{grown} threads for 300 half-sent requests (cap 4)"
        # Each is closed by the server: over the cap at once, the others at their deadline.
        open_ = list(clients)
        deadline = time.monotonic() + 60
        while open_ and time.monotonic() < deadline:
            readable, _, _ = select.select(open_, [], [], 1.0)
            for c in readable:
                assert _closed_by_server(c), "a half-sent request got an answer"
                open_.remove(c)
        assert not open_, f"{len(open_)} connections still open"
        assert server.refused > 0  # the cap was reached: those were closed on accept, with no thread
        wait_until(lambda: _handler_threads() <= before, timeout=30, what="handler threads gone")
    finally:
        for c in clients:
            c.close()
    # The port still serves a real scrape (and /healthz without a token).
    assert requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=5).status_code == 200
    assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 401
    assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200


def test_a_request_dribbled_a_byte_at_a_time_is_cut_at_one_deadline(node_port):
    """The timeout bounds the whole head, not each read: a byte every 0.2 s
    (each read well within 1 s) is still closed before the head is complete."""
    _server, port = node_port
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n"
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sent, closed, answered = 0, False, False
        while sent < len(head):
            try:
                c.sendall(head[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sent += 1
            if select.select([c], [], [], 0.2)[0]:
                closed = _closed_by_server(c)
                answered = not closed
                break
        assert closed and not answered and sent < len(head), \
            f"sent {sent} of {len(head)} bytes: closed={closed}, answered={answered}"
    finally:
        c.close()
