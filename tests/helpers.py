"""What tests share besides fixtures (those are tests/conftest.py's): the
suite's servers and their addresses, keys and headers, worker processes,
waiting for a condition, reading a job's row, submitting a job, reading the
Redis gate and dispatch state the product never reads back.

The addresses (PG_ADMIN_DSN, REDIS_BASE, SERVERS) are set by conftest's
pytest_configure before any test module is imported: read them as
``helpers.X`` or import them at a test module's top, never from a module
conftest imports.  Nothing here imports app/ at import time (the session's
settings are not in the environment yet when conftest loads).

Invariant: a helper is defined once in tests/; test modules import it from
here (``from helpers import ...``), never from conftest.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import redis as redis_lib
import requests

ROOT = Path(__file__).resolve().parent.parent
TEST_DB = os.environ.get("ASYNCH_TEST_DB", "asynch_test")
GATE_DB = int(os.environ.get("ASYNCH_TEST_REDIS_GATE_DB", "15"))
BROKER_DB = int(os.environ.get("ASYNCH_TEST_REDIS_BROKER_DB", "14"))
# Set by conftest.pytest_configure, before any test module is imported.
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


def redis_db(db: int) -> redis_lib.Redis:
    """A client of one DB number on the suite's Redis."""
    return redis_lib.Redis.from_url(f"{REDIS_BASE}/{db}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_key(tenant: str, admin: bool = False) -> str:
    from app.tenancy.keys import create_key

    key, _ = create_key(tenant, "admin" if admin else "user")
    return key


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


class WorkerProcess:
    def __init__(self, env: dict, concurrency: int = 2, log_path: Path | None = None, name: str = "w",
                 extra_args: tuple[str, ...] = (), callbacks: bool = False, argv: list[str] | None = None):
        self.env = {**os.environ, **env}
        self.argv = argv  # a whole command (e.g. app.cli.processes.callback_worker_argv() with its defaults)
        # callbacks=True: what `asynch callback-worker` runs (the callback queue only).
        self.queue = self.env["ASYNCH_CALLBACK_QUEUE_NAME" if callbacks else "ASYNCH_QUEUE_NAME"]
        self.concurrency = concurrency
        self.log_path = log_path
        self.name = name
        # e.g. ("--include", "flaky_storage"): test-only modules the worker imports.
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None

    def start(self, ready_timeout: float = 60) -> "WorkerProcess":
        from app.cli.processes import worker_argv

        argv = ((self.argv or worker_argv(self.concurrency, self.queue))
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


# --- waiting, reading, submitting ---------------------------------------------------------

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


def submit_job(model: str, payload, principal=None, **opts) -> str:
    """Submit one job in-process (no HTTP) as ``principal`` (P by default);
    ``opts`` are SubmitOptions fields.  The new job's id."""
    from app.jobs import service as jobs

    return jobs.submit(principal or _principal(), model, payload, jobs.SubmitOptions(**opts)).row.id


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """A Prometheus exposition's samples: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(sm: dict, name: str, **labels) -> float:
    return sm.get((name, frozenset(labels.items())), 0.0)


def _principal():
    # P, tenant-a's user principal, built on first use: app/ is not imported at import time.
    if "P" not in globals():
        from app.tenancy.keys import Principal

        globals()["P"] = Principal("tenant-a", "user", None)
    return globals()["P"]


def __getattr__(name: str):
    if name == "P":
        return _principal()
    raise AttributeError(name)


class Count:
    """Statements sent to PostgreSQL (every engine: ``sql`` their verbs, ``statements`` their text) and
    gate/broker calls sent to Redis."""

    def __init__(self, this_thread: bool = False) -> None:
        self.sql: list[str] = []
        self.statements: list[str] = []
        self.redis: list[str] = []
        # Only what this thread sends (a process's other threads: a writer, a watcher, a listener).
        self._only = threading.get_ident() if this_thread else None

    def reads(self, fragment: str) -> int:
        """The statements whose text holds ``fragment``."""
        return sum(fragment in s for s in list(self.statements))

    def __enter__(self) -> "Count":
        import redis.connection
        from sqlalchemy import event

        from app.infra.db import get_engine

        event.listen(get_engine(True), "before_cursor_execute", self._sql)
        event.listen(get_engine(False), "before_cursor_execute", self._sql)
        self._real = redis.connection.AbstractConnection.send_packed_command
        me = self

        def send(conn, command, check_health=True):
            raw = b"".join(command) if isinstance(command, list) else command
            if me._only in (None, threading.get_ident()):
                me.redis.append(raw.split(b"\r\n")[2].decode().upper() if raw.startswith(b"*") else "?")
            return me._real(conn, command, check_health)

        redis.connection.AbstractConnection.send_packed_command = send
        return self

    def __exit__(self, *exc) -> None:
        import redis.connection
        from sqlalchemy import event

        from app.infra.db import get_engine

        redis.connection.AbstractConnection.send_packed_command = self._real
        event.remove(get_engine(True), "before_cursor_execute", self._sql)
        event.remove(get_engine(False), "before_cursor_execute", self._sql)

    def _sql(self, _conn, _cur, statement, *_a) -> None:
        if self._only in (None, threading.get_ident()):
            self.sql.append(statement.split(None, 1)[0].upper())
            self.statements.append(statement)


# --- Redis state the product writes but never reads back this way -------------------------

def gate_members(model: str, tenant: str | None = None) -> set[str]:
    """The jobs holding a slot of the model's gate (or of ``tenant``'s gate on it)."""
    from app.infra.redis import keys
    from app.infra.redis.client import get_redis

    return set(get_redis().zrange(keys.gate(model) if tenant is None else keys.tenant_gate(model, tenant), 0, -1))


def gate_depth(model: str, tenant: str | None = None) -> int:
    return len(gate_members(model, tenant))


def tenant_depth(model: str, tenant: str) -> int:
    return gate_depth(model, tenant)


def permits(model: str, tenant: str) -> list[str]:
    """The jobs holding one of ``tenant``'s dispatch permits on ``model``."""
    from app.infra.redis import keys
    from app.infra.redis.client import get_redis

    return list(get_redis().zrange(keys.semaphore(model, tenant), 0, -1))


def ring(model: str) -> list[tuple[str, float]]:
    """(tenant, pass), lowest first (blocked tenants are not in it; one below its minimum goes first)."""
    from app.infra.redis import keys
    from app.infra.redis.client import get_redis

    return [(t, float(p)) for t, p in get_redis().zrange(keys.dispatch_ring(model), 0, -1, withscores=True)]


def clear_dispatch(model: str) -> None:
    """Drop a model's whole dispatch state."""
    from app.infra.redis import keys
    from app.infra.redis.client import get_redis

    r = get_redis()
    doomed = [keys.dispatch_ring(model), keys.dispatch_blocked(model), keys.dispatch_pass(model),
              keys.dispatch_job_info(model), keys.dispatch_conf(model), keys.dispatch_attempts(model),
              keys.dispatch_charges(model)]
    for prefix in (keys.dispatch_ready(model, ""), keys.semaphore(model, "")):
        doomed += list(r.scan_iter(match=prefix + "*", count=500))
    if doomed:
        r.delete(*doomed)


def publish_terminal(job_id: str) -> None:
    """Wake long-poll waiters of ``job_id`` as dispatch.finish's script does."""
    from app.infra.redis import keys
    from app.infra.redis.client import get_redis

    get_redis().publish(keys.terminal_channel(), job_id)


def seed_signature_ok(secret: str, task_id: str, timestamp: str, url: str, signature: str) -> bool:
    """What a seed-era receiver checks: the legacy X-Asynch-Signature header (app/delivery/signing_secrets.py)."""
    import hmac

    from app.delivery.signing_secrets import sign

    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    return hmac.compare_digest(sign(secret, task_id, ts, url), signature or "")
