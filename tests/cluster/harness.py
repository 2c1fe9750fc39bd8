"""A multi-host cluster on one machine: every host in its own network
namespace (its own interfaces, addresses, ports and hostname), joined by
the user-space wire (wire.py), running our real commands.

  root  10.213.0.1   the test process: clients, checks
  db    10.213.0.2   PostgreSQL (its own, initdb'd here), PgBouncer in
                     transaction pooling mode, Redis (gates: db 0, broker: db 1)
  model 10.213.0.3   the stub model service (model_stub.py)
  api1  10.213.0.11  `python -m app.cli api`  (gunicorn, 2 gevent workers)
  api2  10.213.0.12
  w1    10.213.0.21  `python -m app.cli worker -c 4`
  w2    10.213.0.22
  beat1 10.213.0.31  `python -m app.cli beat`
  beat2 10.213.0.32

Every process reaches PostgreSQL only through PgBouncer.  The cluster builds
itself and tears itself down, and first removes what an interrupted run
left behind (namespaces and devices named ``asyc-*``, its wire process).
Traffic exists only between the devices it made; the machine's own
PostgreSQL and Redis are never touched.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import redis
import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PREFIX = "asyc"
NET = "10.213.0"
STATE = Path("/tmp/asynch-cluster-harness")
PG_PORT, BOUNCER_PORT, REDIS_PORT, MODEL_PORT, API_PORT = 5432, 6432, 6379, 8080, 8000
CHECKS = "cluster-checks"  # application_name of the harness's own direct connections
POOL_SIZE = 8  # PgBouncer's default_pool_size: what PostgreSQL sees at most per (db, user)

HOSTS = {"db": 2, "model": 3, "api1": 11, "api2": 12, "w1": 21, "w2": 22, "beat1": 31, "beat2": 32}
ROLES = {"api1": "api", "api2": "api", "w1": "worker", "w2": "worker", "beat1": "beat", "beat2": "beat"}


def ip(host: str) -> str:
    return "10.213.0.1" if host == "root" else f"{NET}.{HOSTS[host]}"


def ns(host: str) -> str:
    return f"{PREFIX}-{host}"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def available() -> str | None:
    """Why the harness cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "unshare", "runuser", "redis-server", "pgbouncer", "initdb", "postgres"):
        if not shutil.which(tool):
            return f"{tool} not found (scripts/services.sh --cluster installs what is missing)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    return None


def cleanup_leftovers(runs: bool = True) -> None:
    """Remove what an earlier (interrupted) run left: its wire, namespaces
    named asyc-* with every process in them, devices named asyc-*."""
    pidfile = STATE / "wire.pid"
    if pidfile.exists():
        try:
            pid = int(pidfile.read_text())
            if "wire.py" in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)
        except (ValueError, OSError):
            pass
        pidfile.unlink(missing_ok=True)
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX + "-"):
            kill_namespace(name)
            _run("ip", "netns", "del", name, check=False)
    for old in STATE.glob("run-*") if runs and STATE.exists() else ():
        shutil.rmtree(old, ignore_errors=True)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        dev = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if dev.startswith(PREFIX + "-"):
            _run("ip", "link", "del", dev, check=False)


def kill_namespace(name: str) -> list[int]:
    """SIGKILL every process inside the namespace (a host dies at once)."""
    pids = [int(p) for p in _run("ip", "netns", "pids", name, check=False).stdout.split()]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


class Cluster:
    def __init__(self, env: dict | None = None) -> None:
        # Logs and results stay after the run (for a failed CI run) until the next run.
        self.dir = STATE / f"run-{os.getpid()}"
        self.procs: dict[str, list[subprocess.Popen]] = {}
        self.wire: subprocess.Popen | None = None
        self.extra_env = env or {}
        self.results = self.dir / "results"
        # Owned by postgres, so outside pytest's private temporary tree.
        self.pgroot = STATE / f"pg-{os.getpid()}"
        self.pgdata = self.pgroot / "data"
        self.keys: dict[str, str] = {}

    # -- settings ---------------------------------------------------------
    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg2://postgres@{ip('db')}:{BOUNCER_PORT}/asynch"

    @property
    def redis_url(self) -> str:
        return f"redis://{ip('db')}:{REDIS_PORT}/0"

    @property
    def model_url(self) -> str:
        return f"http://{ip('model')}:{MODEL_PORT}"

    def app_env(self) -> dict:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCH_", "PROMETHEUS_"))}
        return {**base,
                "ASYNCH_DATABASE_URL": self.database_url, "ASYNCH_REDIS_URL": self.redis_url,
                "ASYNCH_BROKER_URL": f"redis://{ip('db')}:{REDIS_PORT}/1",
                "ASYNCH_STORAGE_URL": f"file://{self.results}", "ASYNCH_KEY_PEPPER": "cluster-pepper",
                # One machine, weak secrets: dev mode (app/secret_settings.py check_startup).
                "ASYNCH_DEV_MODE": "1",
                "ASYNCH_LOG_LEVEL": "INFO", "ASYNCH_DB_POOL_SIZE": "4",
                "ASYNCH_REDIS_TIMEOUT_SECONDS": "2", "ASYNCH_LEASE_GRACE_SECONDS": "2",
                "ASYNCH_RETRY_BACKOFF_SECONDS": "0.2", "ASYNCH_RETRY_BACKOFF_MAX_SECONDS": "1",
                # Short passes for short scenarios, yet not so short that under
                # 100 ms round trips the maintenance tasks fill every worker process.
                "ASYNCH_BEAT_RETRY_SECONDS": "2", "ASYNCH_BEAT_RECOVER_SECONDS": "3",
                "ASYNCH_BEAT_LOCK_TTL_SECONDS": "3", "ASYNCH_DISPATCH_BELL_SECONDS": "5",
                "ASYNCH_REPUBLISH_AFTER_SECONDS": "10", "ASYNCH_RECONCILE_GRACE_SECONDS": "5",
                "ASYNCH_WORKER_HEARTBEAT_SECONDS": "1", **self.extra_env}

    @contextmanager
    def as_client(self):
        """This process's settings pointed at the cluster (for setup and checks)."""
        from app.config import get_settings, load_settings, set_settings
        from app.infra.db import reset_engine
        from app.infra.redis.client import reset_redis

        before = get_settings()
        set_settings(load_settings(self.app_env()))
        reset_engine()
        reset_redis()
        try:
            yield
        finally:
            set_settings(before)
            reset_engine()
            reset_redis()

    # -- build --------------------------------------------------------------
    def start(self) -> "Cluster":
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "Cluster":
        cleanup_leftovers()
        STATE.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.results.mkdir(exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        for h in HOSTS:
            _run("ip", "netns", "add", ns(h))
        cfg = {"control": str(self.dir / "wire.sock"), "net_prefix_len": 24,
               "hosts": [{"name": "root", "tap": f"{PREFIX}-root", "ns": None, "ip": ip("root")}]
               + [{"name": h, "tap": f"{PREFIX}-{h}", "ns": ns(h), "ip": ip(h)} for h in HOSTS]}
        (self.dir / "wire.json").write_text(json.dumps(cfg))
        self.wire = subprocess.Popen([sys.executable, str(HERE / "wire.py"), str(self.dir / "wire.json")],
                                     stdout=subprocess.PIPE, stderr=open(self.dir / "logs" / "wire.log", "w"),
                                     text=True, start_new_session=True)
        (STATE / "wire.pid").write_text(str(self.wire.pid))
        if self.wire.stdout.readline().strip() != "ready":
            raise RuntimeError(f"wire did not start: {(self.dir / 'logs' / 'wire.log').read_text()}")
        self._start_db()
        self._spawn("model", [sys.executable, str(HERE / "model_stub.py"), ip("model"), str(MODEL_PORT)])
        self._wait(lambda: requests.get(self.model_url + "/_calls", timeout=1).ok, "the model service")
        self._migrate()
        for host in ROLES:
            self.start_host(host)
        self.wait_ready()
        return self

    def _start_db(self) -> None:
        pg = self.pgroot
        shutil.rmtree(pg, ignore_errors=True)
        pg.mkdir(parents=True)
        STATE.chmod(0o755)
        shutil.chown(pg, "postgres")
        if not (self.pgdata / "PG_VERSION").exists():
            _run("runuser", "-u", "postgres", "--", "initdb", "-D", str(self.pgdata), "-A", "trust", "-U", "postgres")
            with open(self.pgdata / "pg_hba.conf", "a") as f:  # the cluster's own addresses only
                f.write(f"host all all {NET}.0/24 trust\n")
        self._spawn("db", ["runuser", "-u", "postgres", "--", "postgres", "-D", str(self.pgdata),
                           "-c", f"listen_addresses=127.0.0.1,{ip('db')}", "-p", str(PG_PORT),
                           "-c", f"unix_socket_directories={pg}", "-c", "max_connections=100",
                           "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                    name="postgres")
        self._spawn("db", ["redis-server", "--bind", f"127.0.0.1 {ip('db')}", "--port", str(REDIS_PORT),
                           "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                           # reachable only inside the cluster's own network
                           "--protected-mode", "no"], name="redis")
        self._wait(lambda: psycopg2.connect(host=ip("db"), port=PG_PORT, user="postgres", dbname="postgres",
                                            connect_timeout=2).close() is None, "PostgreSQL")
        conn = psycopg2.connect(host=ip("db"), port=PG_PORT, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = 'asynch'")
            if not cur.fetchone():
                cur.execute("CREATE DATABASE asynch")
        conn.close()
        (pg / "userlist.txt").write_text('"postgres" ""\n')
        (pg / "pgbouncer.ini").write_text(f"""[databases]
asynch = host=127.0.0.1 port={PG_PORT} dbname=asynch

[pgbouncer]
listen_addr = 127.0.0.1,{ip('db')}
listen_port = {BOUNCER_PORT}
unix_socket_dir =
auth_type = trust
auth_file = {pg / 'userlist.txt'}
admin_users = postgres
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 2000
server_reset_query =
logfile = {pg / 'pgbouncer.log'}
pidfile = {pg / 'pgbouncer.pid'}
""")
        for f in ("userlist.txt", "pgbouncer.ini"):
            shutil.chown(pg / f, "postgres")
        self._spawn("db", ["pgbouncer", "-u", "postgres", str(pg / "pgbouncer.ini")], name="pgbouncer")
        self._wait(lambda: psycopg2.connect(host=ip("db"), port=BOUNCER_PORT, user="postgres", dbname="asynch",
                                            connect_timeout=2).close() is None, "PgBouncer")
        self._wait(lambda: redis.Redis(host=ip("db"), port=REDIS_PORT, socket_timeout=2).ping(), "Redis")

    def _migrate(self) -> None:
        # Through PgBouncer, as the deployment's migration Job does.
        out = subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade"], cwd=ROOT, env=self.app_env(),
                             capture_output=True, text=True, timeout=180)
        if out.returncode:
            raise RuntimeError(f"migration failed: {out.stderr[-3000:]}")

    def _spawn(self, host: str, argv: list[str], name: str | None = None, uts: bool = False) -> subprocess.Popen:
        """Start ``argv`` inside the host's namespace (with ``uts``: with its own hostname too)."""
        name = name or host
        cmd = ["ip", "netns", "exec", ns(host)]
        if uts:
            cmd += ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh"]
        cwd = self.dir / "hosts" / host
        cwd.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "logs" / f"{name}.log", "a")
        p = subprocess.Popen(cmd + argv, cwd=cwd, env=self.app_env(), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.setdefault(host, []).append(p)
        return p

    def start_host(self, host: str) -> None:
        role = ROLES[host]
        argv = {"api": [sys.executable, "-m", "app.cli", "api", "--bind", f"{ip(host)}:{API_PORT}", "--workers", "2"],
                "worker": [sys.executable, "-m", "app.cli", "worker", "-c", "4"],
                "beat": [sys.executable, "-m", "app.cli", "beat"]}[role]
        self._spawn(host, argv, uts=True)

    def kill_host(self, host: str) -> int:
        """Every process of the host dies at once (SIGKILL), as when it loses power."""
        pids = kill_namespace(ns(host))
        for p in self.procs.pop(host, []):
            p.wait(10)
        return len(pids)

    def api(self, host: str) -> str:
        return f"http://{ip(host)}:{API_PORT}"

    def wait_ready(self, hosts=None, timeout: float = 90) -> None:
        hosts = list(hosts or ROLES)
        r = self.redis()
        for h in hosts:
            if ROLES[h] == "api":
                self._wait(lambda h=h: requests.get(self.api(h) + "/readyz", timeout=2).status_code == 200,
                           f"{h}'s API", timeout)
        workers = [h for h in hosts if ROLES[h] == "worker"]
        if workers:
            self._wait(lambda: {k.split("@", 1)[1] for k in r.scan_iter("asynch:worker:*")} >= set(workers),
                       "the workers consuming", timeout)
        if any(ROLES[h] == "beat" for h in hosts):
            self._wait(lambda: r.get("asynch:{beat}:leader"), "a beat leading", timeout)

    @staticmethod
    def _wait(pred, what: str, timeout: float = 60) -> None:
        Cluster._wait_value(pred, what, timeout)

    @staticmethod
    def _wait_value(pred, what: str, timeout: float = 60):
        """The first true value of ``pred()`` (errors count as not yet)."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                v = pred()
                if v:
                    return v
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {last!r}")

    # -- network ----------------------------------------------------------
    def wire_cmd(self, **cmd) -> dict:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.dir / "wire.sock"))
            s.sendall((json.dumps(cmd) + "\n").encode())
            answer = json.loads(s.makefile().readline())
        assert answer.get("ok"), answer
        return answer

    def cut(self, a: str, b: str, port: int | None = None) -> None:
        self.wire_cmd(op="cut", a=ip(a), b=ip(b), port=port)

    def heal(self) -> None:
        self.wire_cmd(op="heal")

    def netem(self, delay: float = 0.0, loss: float = 0.0) -> None:
        self.wire_cmd(op="set", delay=delay, loss=loss)

    # -- clients ----------------------------------------------------------
    def redis(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host=ip("db"), port=REDIS_PORT, db=db, decode_responses=True, socket_timeout=10)

    def pg(self):
        """A direct PostgreSQL connection (checks only; the hosts use PgBouncer)."""
        conn = psycopg2.connect(host=ip("db"), port=PG_PORT, user="postgres", dbname="asynch",
                                application_name=CHECKS)
        conn.autocommit = True
        return conn

    def model_calls(self) -> list[dict]:
        return requests.get(self.model_url + "/_calls", timeout=10).json()

    def log(self, name: str) -> str:
        path = self.dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- teardown ---------------------------------------------------------
    def stop(self) -> None:
        for h in list(HOSTS):
            kill_namespace(ns(h))
        for procs in self.procs.values():
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        self.procs = {}
        if self.wire is not None and self.wire.poll() is None:
            self.wire.terminate()
            try:
                self.wire.wait(10)
            except subprocess.TimeoutExpired:
                self.wire.kill()
        (STATE / "wire.pid").unlink(missing_ok=True)
        cleanup_leftovers(runs=False)
        shutil.rmtree(self.pgroot, ignore_errors=True)


class TerminalRecorder:
    """Every terminal wake-up the cluster publishes (one per winning terminal
    transition): job id -> how many times.  A second one would be a second
    terminal transition."""

    def __init__(self, client: redis.Redis) -> None:
        self.counts: dict[str, int] = {}
        self.ps = client.pubsub()
        self.ps.subscribe("asynch:events:terminal")
        self.stop_ = threading.Event()
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self) -> None:
        while not self.stop_.is_set():
            try:
                m = self.ps.get_message(timeout=0.5)
            except Exception:  # the harness's own link is never cut; a hiccup is retried
                time.sleep(0.2)
                continue
            if m and m["type"] == "message":
                data = m["data"]
                jid = json.loads(data)["id"] if data.startswith("{") else data
                self.counts[jid] = self.counts.get(jid, 0) + 1

    def close(self) -> None:
        self.stop_.set()
        self.t.join(5)
        self.ps.close()


class LeaderMonitor:
    """Samples the beat lock every 20 ms: the timeline of (token, owner)."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self.timeline: list[tuple[float, str | None]] = []
        self.stop_ = threading.Event()
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self) -> None:
        while not self.stop_.is_set():
            try:
                v = self.r.get("asynch:{beat}:leader")
            except redis.RedisError:
                v = "?"
            if not self.timeline or self.timeline[-1][1] != v:
                self.timeline.append((time.time(), v))
            time.sleep(0.02)

    def close(self) -> None:
        self.stop_.set()
        self.t.join(5)
