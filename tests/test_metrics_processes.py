"""Per-process metrics, summed across scrape targets, on real process groups:
API servers started as `asynch api` starts them (gunicorn, two workers, one
multiprocess directory each) and worker nodes as `asynch worker` does (the
same directory setup, a metrics port).  Scraped one by one and summed, as
Prometheus' sum() over pods does, they must give the true totals; the
cluster gauges come from /metrics/cluster and equal the database."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from helpers import ROOT, WorkerProcess, auth, free_port, samples, value, wait_until
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from app.clock import as_utc
from app.infra import metrics
from app.infra.db import transaction
from app.infra.tables import model_stats, tasks

pytestmark = pytest.mark.slow
TOKEN = "scrape-secret"


def scrape(url: str, token: str = "") -> dict:
    headers = {"Connection": "close", **({"Authorization": f"Bearer {token}"} if token else {})}
    resp = requests.get(url, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    return samples(resp.text)


class ApiServer:
    """`python -m app.cli api` (= `asynch api`): a gunicorn master and two
    workers; the access log names the worker pid that answered."""

    def __init__(self, test_env: dict, tmp_path: Path, name: str, metrics_dir: Path | None = None,
                 extra_env: dict | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.access = tmp_path / f"{name}-access.log"
        self.log = tmp_path / f"{name}.log"
        env = {**os.environ, **test_env, **(extra_env or {}),
               "GUNICORN_CMD_ARGS": "--access-logfile - --access-logformat '%(p)s %(m)s %(U)s %(s)s'"}
        if metrics_dir is not None:
            env["ASYNCH_METRICS_DIR"] = str(metrics_dir)
        argv = [sys.executable, "-m", "app.cli", "api", "--bind", f"127.0.0.1:{self.port}", "--workers", "2",
                "--threads", "4"]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(self.access, "w"),
                                     stderr=open(self.log, "w"), start_new_session=True)

    def up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"api exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            return requests.get(f"{self.base}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def metrics_dir(self) -> str:
        """The directory `asynch api` chose (it exec'd gunicorn: same pid)."""
        env = Path(f"/proc/{self.proc.pid}/environ").read_bytes().split(b"\0")
        return next(e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"PROMETHEUS_MULTIPROC_DIR="))

    def admitting_pids(self) -> set[str]:
        return {line.split()[0] for line in self.access.read_text().splitlines()
                if re.search(r" POST /v1/models/echo/jobs 202$", line)}

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(15)
        except ProcessLookupError:
            pass


def start_servers(test_env, tmp_path, extra_env=None) -> list[ApiServer]:
    # a: an operator's ASYNCH_METRICS_DIR; b: the default, a fresh temporary one.
    servers = [ApiServer(test_env, tmp_path, "api1", metrics_dir=tmp_path / "api1-metrics", extra_env=extra_env),
               ApiServer(test_env, tmp_path, "api2", extra_env=extra_env)]
    for s in servers:
        wait_until(s.up, timeout=120, what="gunicorn up")  # a bound: up() fails at once if it exits
    return servers


@pytest.fixture
def two_api_servers(test_env, tmp_path):
    servers = start_servers(test_env, tmp_path)
    yield servers
    for s in servers:
        s.stop()


def _submit_split(servers, key: str, n: int, first: int = 0) -> None:
    def one(i: int) -> int:
        return requests.post(f"{servers[i % 2].base}/v1/models/echo/jobs", json={"i": i},
                             headers={**auth(key), "Connection": "close"}, timeout=30).status_code

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(one, range(first, n))) == [202] * (n - first)


def test_two_api_servers_scraped_and_summed_give_the_true_totals(two_api_servers, make_model, user_key, tmp_path):
    n = 60
    make_model("echo", queue_limit=n + 10)
    a, b = two_api_servers
    _submit_split(two_api_servers, user_key, 1)
    time.sleep(1.5)  # the head of the queue is the oldest by this much
    _submit_split(two_api_servers, user_key, n, first=1)
    # Each server's two gunicorn workers admitted some: a server's number is
    # its processes' sum, not one process's memory.
    assert len(a.admitting_pids()) == 2 and len(b.admitting_pids()) == 2

    ta = value(scrape(a.base + "/metrics"), "asynch_admissions_total", model="echo")
    tb = value(scrape(b.base + "/metrics"), "asynch_admissions_total", model="echo")
    assert ta + tb == n, f"summed over the two servers: {ta} + {tb}, expected {n}"
    assert ta == n // 2 and tb == n // 2
    for s in (a, b):  # no gauge on a pod's /metrics: sum() over pods cannot multiply one
        assert not any(name.startswith(("asynch_jobs", "asynch_queue", "asynch_oldest", "asynch_worker"))
                       for name, _ in scrape(s.base + "/metrics"))

    # The cluster gauges: the database's numbers, the same from either pod.
    with transaction() as conn:
        pending = conn.execute(select(func.count()).where(tasks.c.model_name == "echo", tasks.c.state == 0)).scalar()
        head = as_utc(conn.execute(select(func.min(tasks.c.enqueue_at)).where(tasks.c.state == 0)).scalar())
    assert pending == n
    cluster = [scrape(s.base + "/metrics/cluster") for s in (a, b)]
    expected_age = time.time() - head.timestamp()
    for sm in cluster:
        assert value(sm, "asynch_jobs", model="echo", state="pending") == pending
        assert sum(v for (name, lab), v in sm.items() if name == "asynch_jobs") == pending
        assert value(sm, "asynch_queue_depth", model="echo") == n
        assert value(sm, "asynch_queue_limit", model="echo") == n + 10
        assert value(sm, "asynch_running", model="echo") == 0
        assert 1.5 <= value(sm, "asynch_oldest_pending_age_seconds", model="echo") <= expected_age + 0.5
        assert value(sm, "asynch_oldest_pending_age_seconds", model="echo") >= expected_age - 5
    ages = ("asynch_oldest_pending_age_seconds", "asynch_dispatch_bell_age_seconds")  # they grow between scrapes
    for sm in cluster:  # no worker answers: the model's doorbell is out since the first submission
        assert 1.5 <= value(sm, "asynch_dispatch_bell_age_seconds", model="echo") <= expected_age + 0.5
    steady = [{k: v for k, v in sm.items() if k[0] not in ages} for sm in cluster]
    assert steady[0] == steady[1]

    dirs = [s.metrics_dir() for s in (a, b)]
    assert dirs[0] == str(tmp_path / "api1-metrics") and os.path.isdir(dirs[1])
    for s in (a, b):
        s.stop()
    assert os.path.isdir(dirs[0]), "a configured ASYNCH_METRICS_DIR stays"
    assert not os.path.exists(dirs[1]), "the temporary directory goes with its server"


def test_a_second_server_on_the_same_directory_refuses_to_start(test_env, tmp_path, make_model, user_key):
    make_model("echo", queue_limit=10)
    # One running server on an operator's directory is all this needs (the
    # default-directory server of two_api_servers took no part: its start was
    # a gunicorn master and two workers spent for nothing).
    a = ApiServer(test_env, tmp_path, "api1", metrics_dir=tmp_path / "api1-metrics")
    try:
        wait_until(a.up, timeout=120, what="gunicorn up")  # a bound: up() fails at once if it exits
        _submit_split([a, a], user_key, 4)
        intruder = ApiServer(test_env, tmp_path, "intruder", metrics_dir=tmp_path / "api1-metrics")
        try:
            assert intruder.proc.wait(30) != 0
        finally:
            intruder.stop()
        assert "in use by another process group" in intruder.log.read_text()
        # ... and did not wipe the running server's counts.
        assert value(scrape(a.base + "/metrics"), "asynch_admissions_total", model="echo") == 4
    finally:
        a.stop()


def _listening_pids(port: int, pids: list[int]) -> set[int]:
    inodes = {ln.split()[9] for ln in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if int(ln.split()[1].split(":")[1], 16) == port and ln.split()[3] == "0A"}
    assert inodes, f"nobody listens on {port}"
    out = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes}:
                    out.add(pid)
            except OSError:
                pass
    return out


def _worker_node(test_env, tmp_path, name: str) -> WorkerProcess:
    """What `asynch worker` starts (group_env, then Celery), plus a node name
    so two nodes on one host stay two in the liveness keys."""
    port = free_port()
    env = {**test_env, **metrics.group_env(str(tmp_path / f"{name}-metrics")),
           "ASYNCH_WORKER_METRICS_PORT": str(port), "ASYNCH_METRICS_TOKEN": TOKEN,
           # Two slots a process: the model's 8 permits need all four processes (with the default 8, one
           # process's slots could run every call, and the other node would have nothing to report).
           "ASYNCH_WORKER_SLOTS": "2"}
    node = WorkerProcess(env, concurrency=2, log_path=tmp_path / f"{name}.log", name=name).start()
    node.metrics_url, node.metrics_port = f"http://127.0.0.1:{port}/metrics", port
    node.metrics_dir = Path(env["PROMETHEUS_MULTIPROC_DIR"])
    return node


@pytest.mark.e2e
def test_real_jobs_through_two_api_servers_and_two_worker_nodes(test_env, make_model, user_key, tmp_path):
    n = 100
    make_model("echo", queue_limit=n + 50, max_concurrency=8)
    servers = start_servers(test_env, tmp_path, extra_env={"ASYNCH_METRICS_TOKEN": TOKEN})
    nodes = []
    try:
        start = time.time()
        nodes = [_worker_node(test_env, tmp_path, f"w{i}") for i in (1, 2)]
        # Only a node's main process holds its metrics port (pool children close their inherited copy).
        for node in nodes:
            assert _listening_pids(node.metrics_port, [node.proc.pid, *node.pool_pids()]) == {node.proc.pid}
            assert requests.get(node.metrics_url, timeout=5).status_code == 401
            assert requests.get(node.metrics_url.replace("/metrics", "/x"), timeout=5).status_code == 404

        _submit_split(servers, user_key, n)
        wait_until(lambda: _states() == {2: n}, timeout=150, interval=0.5, what=f"{n} jobs done")
        calls = _calls()

        api = [scrape(s.base + "/metrics", TOKEN) for s in servers]
        node_sm = [scrape(node.metrics_url, TOKEN) for node in nodes]
        everyone = api + node_sm

        def total(sms, name, **labels) -> float:
            return sum(value(sm, name, **labels) for sm in sms)

        assert total(api, "asynch_admissions_total", model="echo") == n
        assert total(node_sm, "asynch_model_call_duration_seconds_count", model="echo", outcome="ok") == calls == n
        assert total(node_sm, "asynch_model_call_duration_seconds_bucket", model="echo", outcome="ok",
                     le="+Inf") == n
        assert all(0 < value(sm, "asynch_model_call_duration_seconds_count", model="echo", outcome="ok") < n
                   for sm in node_sm), "each node reports its own calls, not the cluster's"
        # A done job is finished by the worker that ran it: counted once, on its node.
        assert total(everyone, "asynch_job_duration_seconds_count", model="echo", state="done") == n
        assert total(api, "asynch_job_duration_seconds_count", model="echo", state="done") == 0
        # Each node's number sums its pool processes (one file per process).
        for node in nodes:
            assert len(list(node.metrics_dir.glob("histogram_*.db"))) >= 2

        cluster = scrape(servers[0].base + "/metrics/cluster", TOKEN)
        assert value(cluster, "asynch_jobs", model="echo", state="done") == n
        assert value(cluster, "asynch_queue_depth", model="echo") == 0
        assert value(cluster, "asynch_oldest_pending_age_seconds", model="echo") == 0
        assert value(cluster, "asynch_workers_consuming") == 2
        consumed = {dict(lab)["worker"]: v for (name, lab), v in cluster.items()
                    if name == "asynch_worker_last_consumed_seconds"}
        assert len(consumed) == 2 and all(v >= start - 1 for v in consumed.values()), consumed

        # Liveness means consuming: a stopped worker leaves the count.
        nodes[1].stop()
        wait_until(lambda: value(scrape(servers[1].base + "/metrics/cluster", TOKEN),
                                 "asynch_workers_consuming") == 1, timeout=30, what="stopped worker dropped")
    finally:
        for node in nodes:
            node.stop()
        for s in servers:
            s.stop()


def _states() -> dict[int, int]:
    with transaction() as conn:
        q = select(tasks.c.state, func.count()).where(tasks.c.model_name == "echo").group_by(tasks.c.state)
        return dict(conn.execute(q).all())


def _calls() -> int:
    with transaction() as conn:
        return int(conn.execute(select(func.coalesce(func.sum(model_stats.c.request_count), 0)).where(
            model_stats.c.model_name == "echo")).scalar_one())


def documented_families(target: str) -> set[str]:
    """The metric names of a row of docs/operations.md's Metrics table
    ("API server" or "worker node"), without the _total suffix."""
    text = (Path(ROOT) / "docs" / "operations.md").read_text()
    (row,) = [ln for ln in text.splitlines() if ln.startswith(f"| {target} (")]
    what = row.split("|")[3]
    return {re.sub(r"_total$", "", n) for n in re.findall(r"`(asynch_[a-z_]+)", what)}


def check_text_format(text: str) -> list:
    """promtool's lint when it is installed (Debian's prometheus package),
    and prometheus_client's parser always."""
    fams = list(text_string_to_metric_families(text))
    if os.access("/usr/bin/promtool", os.X_OK):
        out = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    return fams


@pytest.mark.e2e
def test_the_first_scrape_lists_every_documented_family_with_zeros(test_env, make_model, tmp_path):
    make_model("echo")
    make_model("pic")
    from app.infra.metrics import FAMILIES
    assert documented_families("API server") == set(FAMILIES["api"])
    assert documented_families("worker node") == set(FAMILIES["node"])
    api = ApiServer(test_env, tmp_path, "fresh")
    node = None
    try:
        wait_until(api.up, timeout=120, what="gunicorn up")
        node = _worker_node(test_env, tmp_path, "fresh-node")
        for url, target, token in [(api.base + "/metrics", "API server", ""), (node.metrics_url, "worker node", TOKEN)]:
            resp = requests.get(url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=10)
            assert resp.status_code == 200 and resp.text, f"{target}: an empty first scrape"
            fams = check_text_format(resp.text)
            assert documented_families(target) <= {f.name for f in fams}, target
            sm = samples(resp.text)
            for model in ("echo", "pic"):
                for state in ("done", "failed", "timeout", "canceled"):
                    assert (("asynch_job_duration_seconds_count", frozenset({"model": model, "state": state}.items()))
                            in sm), (target, model, state)
            # (run_job messages: a node may take stale ones a previous test left on the broker)
            assert all(v == 0 for (n, _), v in sm.items() if "run_job" not in n), f"{target}: nothing happened"
            if target == "API server":
                assert ("asynch_admissions_total", frozenset({"model": "echo"}.items())) in sm
                assert ("asynch_rejections_total", frozenset({"model": "pic", "reason": "queue_full"}.items())) in sm
                assert ("asynch_waiters", frozenset()) in sm
            else:
                assert ("asynch_model_call_duration_seconds_count",
                        frozenset({"model": "pic", "outcome": "error"}.items())) in sm
                assert ("asynch_run_job_messages_total", frozenset({"outcome": "stale"}.items())) in sm
    finally:
        if node is not None:
            node.stop()
        api.stop()
