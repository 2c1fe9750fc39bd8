"""Start and stop the pieces a benchmark needs, all on 127.0.0.1: a
PostgreSQL database (migrated), Redis databases, gunicorn apps, Celery
workers and the stub model in its own process."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg2
import redis

ROOT = Path(__file__).resolve().parent.parent
# The servers a benchmark uses: BENCH_PG_ADMIN (an admin DSN) and BENCH_REDIS
# (redis://[:password@]host:port); tests/test_bench_cost.py passes the suite's own.
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_BASE = PG_ADMIN.rsplit("/", 1)[0]
REDIS_BASE = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")
DB_NAME = os.environ.get("BENCH_DB", "asynch_bench")  # a private one: BENCH_DB (parallel runs)
# Redis DB numbers of the benchmarks (tests use 14 and 15; parallel
# checkouts' tests pick theirs through ASYNCH_TEST_REDIS_*): BENCH_REDIS_DBS
# "gate,broker,counter,naive" moves them.
GATE_DB, BROKER_DB, COUNTER_DB, NAIVE_BROKER_DB = (int(x) for x in
                                                   os.environ.get("BENCH_REDIS_DBS", "8,9,10,11").split(","))
LOGS = ROOT / "bench" / "logs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def db_dsn() -> str:
    """libpq DSN of the benchmark's database."""
    return f"{PG_BASE}/{DB_NAME}"


def redis_db(db: int) -> redis.Redis:
    return redis.Redis.from_url(f"{REDIS_BASE}/{db}")


def env(**extra) -> dict:
    e = {
        **os.environ,
        "ASYNCH_DATABASE_URL": PG_BASE.replace("postgresql://", "postgresql+psycopg2://", 1) + f"/{DB_NAME}",
        "ASYNCH_REDIS_URL": f"{REDIS_BASE}/{GATE_DB}",
        "ASYNCH_BROKER_URL": f"{REDIS_BASE}/{BROKER_DB}",
        "ASYNCH_STORAGE_URL": f"file://{ROOT}/bench/logs/results",
        "ASYNCH_QUEUE_NAME": "asynch-bench",
        "ASYNCH_LOG_LEVEL": "WARNING",
        # A bench on one machine runs in dev mode: outside it the API refuses a weak pepper,
        # an empty secrets key and an empty metrics token (app/secret_settings.py check_startup).
        "ASYNCH_DEV_MODE": "1",
        "ASYNCH_KEY_PEPPER": os.environ.get("ASYNCH_KEY_PEPPER") or "bench-pepper",
        "BENCH_NAIVE_BROKER": f"{REDIS_BASE}/{NAIVE_BROKER_DB}",
        "BENCH_NAIVE_COUNTER": f"{REDIS_BASE}/{COUNTER_DB}",
    }
    e.update({k: str(v) for k, v in extra.items()})
    return e


def apply_env() -> None:
    os.environ.update({k: v for k, v in env().items() if k.startswith(("ASYNCH_", "BENCH_"))})


def recreate_database() -> None:
    conn = psycopg2.connect(PG_ADMIN)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname=%s", (DB_NAME,))
        cur.execute(f"DROP DATABASE IF EXISTS {DB_NAME}")
        cur.execute(f"CREATE DATABASE {DB_NAME}")
    conn.close()
    subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade"], cwd=ROOT, env=env(), check=True,
                   capture_output=True)


def flush_redis() -> None:
    for db in (GATE_DB, BROKER_DB, COUNTER_DB, NAIVE_BROKER_DB):
        redis_db(db).flushdb()


def fresh(**extra_env: str) -> None:
    """Every benchmark's start: its environment (plus ``extra_env``), an empty
    migrated database, empty Redis databases, and this process's settings read from them."""
    apply_env()
    os.environ.update(extra_env)
    recreate_database()
    flush_redis()
    from app.config import load_settings, set_settings

    set_settings(load_settings())


def truncate_jobs() -> None:
    conn = psycopg2.connect(db_dsn())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("TRUNCATE asynch_task, asynch_model_stat CASCADE")
    conn.close()


class Proc:
    """A child process in its own session, logging to bench/logs/<name>.log."""

    def __init__(self, name: str, argv: list[str], extra_env: dict | None = None):
        LOGS.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log = LOGS / f"{name}.log"
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env(**(extra_env or {})), stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(self, pattern: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log}")
            if re.search(pattern, self.log.read_text(errors="replace")):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready; see {self.log}")

    def pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-g", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def rss_mb(self) -> list[float]:
        """Resident memory of every process in the group (MB)."""
        out = []
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out.append(int(line.split()[1]) / 1024)
            except FileNotFoundError:
                pass
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            except ProcessLookupError:
                pass


def gunicorn(name: str, target: str, port: int, workers: int = 2, threads: int = 16, extra_env=None) -> Proc:
    p = Proc(name, [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", str(workers),
                    "--threads", str(threads), "-k", "gthread", "--backlog", "2048", target], extra_env)
    p.wait_for(r"Booting worker with pid")
    _wait_http(port)
    return p


def _wait_http(port: int, timeout: float = 30) -> None:
    import requests

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port}")


def celery_worker(name: str, app: str, queue: str, concurrency: int = 2, extra_env=None) -> Proc:
    p = Proc(name, [sys.executable, "-m", "celery", "-A", app, "worker", "-c", str(concurrency), "-Q", queue,
                    "--without-gossip", "--without-mingle", "--loglevel", "INFO", "-n", f"{name}@%h"], extra_env)
    p.wait_for(r"ready\.")
    return p


def stub_model(port: int) -> Proc:
    code = ("import time; from app.cli.demo_model import DemoModelServer; "
            f"s = DemoModelServer(port={port}).start(); print('stub up', flush=True); time.sleep(10**6)")
    p = Proc("stub-model", [sys.executable, "-c", code])
    p.wait_for("stub up")
    return p


def create_model(name: str, base_url: str, **kw) -> None:
    from app.catalog.registry import create_model as create
    from app.catalog.schemas import ModelInput

    data = {"model_name": name, "base_url": base_url, "route": "/bench", "queue_limit": 1_000_000,
            "max_concurrency": 64, "timeout_seconds": 30, "expected_seconds": 1, "retry_times": 0}
    data.update(kw)
    create(ModelInput(**data))


def create_key(tenant: str = "bench") -> str:
    from app.tenancy.keys import create_key as create

    return create(tenant, "user")[0]


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def median(values: list[float]) -> float:
    return pct(values, 50)
