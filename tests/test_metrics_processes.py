"""Per-process metrics, summed across scrape targets: two API servers
(gunicorn, two workers each) scraped separately must add up to the true
totals, as Prometheus' sum() over pods does."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, auth, free_port, wait_until


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(sm: dict, name: str, **labels) -> float:
    return sm.get((name, frozenset(labels.items())), 0.0)


class ApiServer:
    """One scrape target: a gunicorn master and its two workers."""

    def __init__(self, test_env: dict, tmp_path, name: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.access = tmp_path / f"{name}-access.log"
        argv = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{self.port}", "--workers", "2",
                "--threads", "4", "--worker-class", "gthread", "--access-logfile", str(self.access),
                "--access-logformat", "%(p)s %(m)s %(U)s %(s)s", "app.wsgi:app"]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **test_env}, stdout=subprocess.DEVNULL,
                                     stderr=open(tmp_path / f"{name}.log", "w"), start_new_session=True)

    def up(self) -> bool:
        try:
            return requests.get(f"{self.base}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def scrape(self, path: str = "/metrics") -> dict:
        resp = requests.get(self.base + path, headers={"Connection": "close"}, timeout=30)
        assert resp.status_code == 200, resp.text
        return samples(resp.text)

    def admitting_pids(self) -> set[str]:
        return {line.split()[0] for line in self.access.read_text().splitlines()
                if re.search(r" POST /v1/models/echo/jobs 202$", line)}

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(15)
        except ProcessLookupError:
            pass


@pytest.fixture
def two_api_servers(test_env, tmp_path):
    servers = [ApiServer(test_env, tmp_path, f"api{i}") for i in (1, 2)]
    try:
        for s in servers:
            wait_until(s.up, timeout=30, what="gunicorn up")
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.mark.slow
def test_two_api_servers_scraped_and_summed_give_the_true_totals(two_api_servers, make_model, user_key):
    n = 60
    make_model("echo", queue_limit=n + 10)
    a, b = two_api_servers

    def one(i: int) -> int:
        server = (a, b)[i % 2]
        return requests.post(f"{server.base}/v1/models/echo/jobs", json={"i": i},
                             headers={**auth(user_key), "Connection": "close"}, timeout=30).status_code

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(one, range(n))) == [202] * n
    # Each server's two gunicorn workers admitted some: a server's number is
    # its processes' sum, not one process's memory.
    assert len(a.admitting_pids()) == 2 and len(b.admitting_pids()) == 2

    def totals() -> tuple[float, float]:
        return (value(a.scrape(), "asynch_admissions_total", model="echo"),
                value(b.scrape(), "asynch_admissions_total", model="echo"))

    deadline = time.time() + 5  # whatever a process may buffer is written by then
    while sum(totals()) < n and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.5)
    ta, tb = totals()
    assert ta + tb == n, f"summed over the two servers: {ta} + {tb}, expected {n}"
    assert ta == n // 2 and tb == n // 2
