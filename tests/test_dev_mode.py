"""Dev mode on the production engines (issue 22, item 1): `asynch dev` starts
its own PostgreSQL and Valkey (app/cli/engines.py) in the checkout's .asynch/
and serves every route as production does -- through the same gunicorn
gevent path -- with its own job worker, callback worker and beat.

Two copies of this checkout (its files as `git ls-files` lists them, the
shared .venv linked in) run `python -m app.cli dev` at once, on different
ports, as an ordinary user (created here when we are root; under root the
interpreter's home, /root, is made reachable for it inside a private mount
namespace only).  Each serves its own jobs; `asynch keys list` run inside
each copy sees that copy's stack (.asynch/dev.json); neither talks to the
machine's PostgreSQL (5432) or Redis (6379) nor changes them.  A dev on a busy
port, and a second dev in a running copy, each fail with one line and change
nothing of the running stack.  SIGTERM stops a stack and everything it
started.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import requests
from helpers import ROOT, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DEV_USER = "asynch-dev-test"
MACHINE_PORTS = {5432, 6379}


def _dev_user() -> tuple[int, int] | None:
    """(uid, gid) the stacks run as: ours if we are not root, else DEV_USER (made here)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(DEV_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", DEV_USER], check=True, capture_output=True)
        pw = pwd.getpwnam(DEV_USER)
    return pw.pw_uid, pw.pw_gid


# Run as DEV_USER: a private mount namespace where /root (0700, the home of
# pyenv's interpreter here) is a tmpfs of mode 0711 holding only .pyenv, then
# drop to the user.  Nothing of the machine changes.
_AS_USER = r'''
set -e
if [ "$NEED_ROOT_OVERLAY" = 1 ]; then
  mkdir -p "$OVERLAY/pyenv"
  mount --bind /root/.pyenv "$OVERLAY/pyenv"
  mount -t tmpfs -o mode=0711 tmpfs /root
  mkdir /root/.pyenv
  mount --move "$OVERLAY/pyenv" /root/.pyenv
fi
exec setpriv --reuid="$DEV_UID" --regid="$DEV_GID" --clear-groups -- "$@"
'''


class Copy:
    """One copy of the checkout, and the `asynch dev` running from it."""

    def __init__(self, base: Path, name: str, user: tuple[int, int] | None):
        self.dir = base / name
        self.user = user
        self.proc: subprocess.Popen | None = None
        self.log = base / f"{name}.log"
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
        for f in filter(None, files):
            src = ROOT / f
            if src.is_file():
                (self.dir / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, self.dir / f)
        (self.dir / ".venv").symlink_to((ROOT / ".venv").resolve())
        if user is not None:
            for p in [self.dir, *self.dir.rglob("*")]:
                os.lchown(p, *user)

    def argv(self, *args: str) -> list[str]:
        argv = [sys.executable, "-m", "app.cli", *args]
        if self.user is None:
            return argv
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _AS_USER, "sh", *argv]

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCH_", "PROMETHEUS_"))}
        env.update(PYTHONPATH=str(self.dir), HOME=str(self.dir), ASYNCH_LOG_LEVEL="WARNING")
        if self.user is not None:
            exe = Path(sys.executable).resolve()
            need = str(exe).startswith("/root/") and not os.stat("/root").st_mode & stat.S_IXOTH
            env.update(DEV_UID=str(self.user[0]), DEV_GID=str(self.user[1]), NEED_ROOT_OVERLAY="1" if need else "0",
                       OVERLAY=str(self.dir.parent / f".{self.dir.name}-overlay"))
        return env

    def start(self, port: int, model_port: int) -> "Copy":
        self.port, self.model_port = port, model_port
        self.proc = subprocess.Popen(self.argv("dev", "--port", str(port), "--model-port", str(model_port)),
                                     cwd=self.dir, env=self.env(), stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), cwd=cwd or self.dir, env=self.env(), capture_output=True,
                              text=True, timeout=120)

    def state(self) -> dict | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"asynch dev exited {self.proc.returncode}: {self.log.read_text()[-30000:]}")
        path = self.dir / ".asynch" / "dev.json"
        return json.loads(path.read_text()) if path.exists() else None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def processes(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def _machine_connections(copies) -> list[str]:
    """TCP connections from any process of the stacks to the machine's 5432 / 6379."""
    out = []
    for c in copies:
        for p in c.processes():
            try:
                conns = p.net_connections(kind="tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            out += [f"{p.pid} {p.name()} -> {x.raddr}" for x in conns if x.raddr and x.raddr.port in MACHINE_PORTS]
    return out


def _machine_redis() -> dict | None:
    """The keys `asynch dev` used to write in the machine's Redis, database 0
    (prefix ``asynch:``, queues ``asynch`` and ``asynch-callbacks`` and their
    kombu bindings), each with its value if a string.  None: no Redis there."""
    import redis

    ours = ("asynch", "asynch-callbacks")
    try:
        r = redis.Redis(host="127.0.0.1", port=6379, db=0, socket_timeout=3)
        keys = [k for k in r.scan_iter(match="*asynch*", count=1000)
                if k.startswith(b"asynch:") or k.split(b"\x06\x16")[0].decode(errors="replace") in ours
                or k.decode(errors="replace") in {f"_kombu.binding.{q}" for q in ours}]
        return {k: r.get(k) if r.type(k) == b"string" else r.type(k) for k in keys}
    except redis.RedisError:
        return None


def _redis_unchanged(before: dict | None, copies) -> None:
    """The machine's Redis gained nothing a stack would write there: no new
    queue, and no new string equal to one of the stacks' own.  (Others on a
    shared machine may write keys of these names meanwhile: their values
    differ, the layout epoch being random per server.)"""
    import redis

    after = _machine_redis()
    if before is None:
        assert after is None, "a Redis appeared on 127.0.0.1:6379"
        return
    assert after is not None
    for k in set(after) - set(before):
        assert isinstance(after[k], bytes), f"new {after[k]} {k!r} in the machine's Redis"
        for c in copies:
            env = json.loads((c.dir / ".asynch" / "dev.json").read_text())["env"] if c.proc.poll() is None else None
            if env:
                assert redis.Redis.from_url(env["ASYNCH_REDIS_URL"]).get(k) != after[k], k


def _machine_pg() -> set | None:
    """The databases of the machine's PostgreSQL named like a dev stack's."""
    import psycopg2

    try:
        conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=3)
    except psycopg2.OperationalError:
        return None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database WHERE datname = 'asynch'")
            return {r[0] for r in cur.fetchall()}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def stacks():
    user = _dev_user()
    base = Path(tempfile.mkdtemp(prefix="asynch-devmode-"))  # not pytest's 0700 tree: the user must reach it
    os.chmod(base, 0o755)
    before = {"redis": _machine_redis(), "pg": _machine_pg()}
    copies = [Copy(base, name, user) for name in ("a", "b")]
    try:
        for c in copies:
            c.start(free_port(), free_port())
        for c in copies:  # the stack's own bound on its API's start is 240 s
            try:
                wait_until(c.state, timeout=300, interval=0.3, what=f"asynch dev in {c.dir}")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- its log ---\n{c.log.read_text()[-30000:]}") from None
        yield {"copies": copies, "before": before, "base": base}
    finally:
        for c in copies:
            for p in c.processes():
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            c.proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)


def _submit_and_read(base: str, key: str, prompt: str) -> dict:
    h = {"Authorization": f"Bearer {key}"}
    r = requests.post(f"{base}/v1/models/demo-echo/jobs", json={"prompt": prompt}, headers=h, timeout=30)
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    w = requests.get(f"{base}/v1/models/demo-echo/jobs/{job}/wait?timeout=30000", headers=h, timeout=40)
    assert w.status_code == 200 and w.json()["state"] == "done", w.text
    res = requests.get(f"{base}/v1/models/demo-echo/jobs/{job}/result", headers=h, timeout=30)
    assert res.status_code == 200, res.text
    return {"job": job, **res.json()}


def test_two_stacks_from_two_copies_serve_their_own_jobs_and_leave_the_machine_alone(stacks):
    a, b = stacks["copies"]
    sa, sb = a.state(), b.state()
    assert sa["ports"]["postgres"] != sb["ports"]["postgres"] and sa["ports"]["valkey"] != sb["ports"]["valkey"]
    assert not MACHINE_PORTS & {sa["ports"]["postgres"], sa["ports"]["valkey"], sb["ports"]["postgres"],
                                sb["ports"]["valkey"]}
    if a.user is not None:  # the stacks run as the ordinary user, PostgreSQL included
        uids = {p.uids().real for c in (a, b) for p in c.processes()}
        assert uids == {a.user[0]}, uids
    # Each serves its own jobs, and neither sees the other's.
    ra = _submit_and_read(a.base, sa["admin_key"], "from a")
    rb = _submit_and_read(b.base, sb["admin_key"], "from b")
    assert ra["echo"] == {"prompt": "from a"} and rb["echo"] == {"prompt": "from b"}
    other = requests.get(f"{b.base}/v1/models/demo-echo/jobs/{ra['job']}", timeout=10,
                         headers={"Authorization": f"Bearer {sb['admin_key']}"})
    assert other.status_code == 404, other.text
    assert requests.get(f"{a.base}/v1/models/demo-echo/jobs", timeout=10, headers={
        "Authorization": f"Bearer {sb['admin_key']}"}).status_code == 401  # b's key means nothing to a
    # `asynch keys list` inside a copy (a subdirectory too) uses that copy's stack.
    for c, s in ((a, sa), (b, sb)):
        out = c.run("keys", "list", cwd=c.dir / "docs")
        assert out.returncode == 0, out.stderr
        assert s["admin_key"].split("_")[1] in out.stdout  # the key's public id
    assert sa["admin_key"].split("_")[1] not in b.run("keys", "list").stdout
    # Nothing of the machine's PostgreSQL or Redis was touched.
    assert _machine_connections((a, b)) == []
    _redis_unchanged(stacks["before"]["redis"], (a, b))
    assert _machine_pg() == stacks["before"]["pg"]


def test_a_dev_that_cannot_start_says_why_in_one_line_and_changes_nothing(stacks):
    a, _ = stacks["copies"]
    sa = a.state()
    # A third copy on a's API port: one line, and a keeps serving as before.
    c = Copy(stacks["base"], "c", a.user)
    busy = subprocess.run(c.argv("dev", "--port", str(a.port), "--model-port", str(free_port())), cwd=c.dir,
                          env=c.env(), capture_output=True, text=True, timeout=120)
    assert busy.returncode == 1
    lines = (busy.stdout + busy.stderr).strip().splitlines()
    assert len(lines) == 1 and f"port {a.port} (the API) is busy" in lines[0], lines
    # A second dev in a's own copy, on free ports: refused by the lock.
    again = a.run("dev", "--port", str(free_port()), "--model-port", str(free_port()))
    lines = (again.stdout + again.stderr).strip().splitlines()
    assert again.returncode == 1 and len(lines) == 1 and "already running" in lines[0], lines
    # a is unchanged: its model still points at its own demo model, and it serves.
    model = requests.get(f"{a.base}/v1/models/demo-echo", timeout=10,
                         headers={"Authorization": f"Bearer {sa['admin_key']}"})
    assert model.status_code == 200 and model.json()["base_url"] == sa["demo_model"], model.text
    assert _submit_and_read(a.base, sa["admin_key"], "still")["echo"] == {"prompt": "still"}
    assert a.state() == sa


def test_every_route_works_under_asynch_dev(stacks):
    a = stacks["copies"][0]
    s = a.state()
    base, h = a.base, {"Authorization": f"Bearer {s['admin_key']}"}

    def call(method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, base + path, headers=h, timeout=30, **kw)

    # v1: submit, wait, result, list, cancel.
    job = _submit_and_read(base, s["admin_key"], "hello")["job"]
    listed = call("GET", "/v1/models/demo-echo/jobs").json()["jobs"]
    assert job in [j["job_id"] for j in listed]
    slow = call("POST", "/v1/models/demo-echo/jobs", json={"prompt": "slow", "sleep_ms": 20000}).json()["job_id"]
    c = call("POST", f"/v1/models/demo-echo/jobs/{slow}/cancel")
    assert c.status_code == 200 and c.json()["state"] == "canceled", c.text

    # seed 002: createModel (with a form), createTask, getTaskResult, getTaskBatch.
    form = [{"field": "prompt", "label": "Prompt", "type": "string", "required": True}]
    m = call("POST", "/model/createModel", json={
        "modelName": "seed-echo", "baseUrl": s["demo_model"], "route": "/echo", "httpMethod": "POST",
        "enabled": 1, "maxConcurrency": 2, "queueLimit": 20, "timeoutSeconds": 30, "expectedSeconds": 1,
        "retryTimes": 1, "autoCleanSeconds": 3600, "form": form})
    assert m.status_code == 200 and m.json()["code"] == 0, m.text
    bad = call("POST", "/task/createTask", json={"modelName": "seed-echo", "requestPayload": {}})
    assert bad.status_code == 422 and bad.json()["code"] == 422, bad.text
    t = call("POST", "/task/createTask", json={"modelName": "seed-echo", "requestPayload": {"prompt": "p"}})
    assert t.status_code == 200 and t.json()["code"] == 0, t.text
    task = t.json()["data"]["task_id"]

    def state() -> int:
        return call("GET", f"/task/getTaskResult?taskId={task}").json()["data"]["state"]

    wait_until(lambda: state() == 2, timeout=60, what="the seed task done")
    batch = call("POST", "/task/getTaskBatch", json={"taskIds": [task]})
    assert batch.status_code == 200, batch.text
    entry = batch.json()["data"][0]
    assert entry["state"] == 2 and entry["claimed"] is True, entry
    assert state() == 4

    # An uploaded file and a batch of it (OpenAI's Files and Batches), so their GET routes have ids.
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "demo-chat", "messages": [{"role": "user", "content": "hi"}]}}
    up = call("POST", "/v1/files", files={"file": ("in.jsonl", json.dumps(line) + "\n")}, data={"purpose": "batch"})
    assert up.status_code == 200, up.text
    made = call("POST", "/v1/batches", json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
                                            "completion_window": "24h"})
    assert made.status_code == 200, made.text

    # Every GET route of the OpenAPI document, with the key: no 5xx.
    doc = call("GET", "/openapi.json").json()
    values = {"model": "demo-echo", "job_id": job, "name": "demo-echo", "tenant": "demo",
              "file_id": up.json()["id"], "batch_id": made.json()["id"]}
    queries = {"/model/getModel": "?modelName=seed-echo", "/task/getTaskResult": f"?taskId={task}",
               "/v1/models/{model}/jobs/{job_id}/wait": "?timeout=1"}
    answered = {}
    for path, ops in doc["paths"].items():
        if "get" not in ops:
            continue
        url = re.sub(r"\{(\w+)\}", lambda g: values[g.group(1)], path) + queries.get(path, "")
        # stream=True: an event stream answers its status and headers at
        # once and then stays open (the tenant's stream never ends by itself).
        with call("GET", url, stream=True) as resp:
            answered[path] = resp.status_code
            if resp.ok and resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                assert next(resp.iter_lines(), None) is not None  # its first line came
    assert len(answered) >= 30, answered
    broken = {p: code for p, code in answered.items() if code >= 500}
    assert not broken, f"5xx under asynch dev: {broken}"


def test_sigterm_stops_a_stack_and_everything_it_started(stacks):
    copies = stacks["copies"]
    assert _machine_connections(copies) == []
    for c in copies:
        procs = c.processes()
        # dev, its PostgreSQL and Valkey, the API, two worker nodes, beat (and their own children).
        assert len(procs) >= 7, procs
        t0 = time.monotonic()
        os.kill(c.proc.pid, signal.SIGTERM)
        assert c.proc.wait(60) == 0, c.log.read_text()[-3000:]
        assert time.monotonic() - t0 < 60
        gone, alive = psutil.wait_procs(procs, timeout=10)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
        assert not (c.dir / ".asynch" / "dev.json").exists()  # no settings of a stack that is gone
        out = c.run("keys", "list")
        assert out.returncode == 1 and out.stderr.strip().count("\n") == 0 and "no database configured" in out.stderr
    _redis_unchanged(stacks["before"]["redis"], ())
    assert _machine_pg() == stacks["before"]["pg"]
