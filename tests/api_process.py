"""The API as a real server process, started the way `asynch api` starts it
(gunicorn with the chosen worker class), and jobs the test moves by hand
through the same transitions a worker uses (claim, complete + the wake-up)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import redis as redis_lib
import requests
from helpers import ROOT, free_port


class ApiProcess:
    def __init__(self, test_env: dict, tmp_path: Path, worker_class: str = "gevent", workers: int = 2,
                 threads: int = 16, extra_env: dict | None = None, name: str = "api") -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"{name}-{worker_class}.log"
        self.env = {**os.environ, **test_env, "ASYNCH_LOG_LEVEL": "WARNING", **(extra_env or {})}
        self.argv = [sys.executable, "-m", "app.cli", "api", "--bind", f"127.0.0.1:{self.port}",
                     "--workers", str(workers), "--worker-class", worker_class, "--threads", str(threads)]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 40) -> "ApiProcess":
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"), start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"api exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                if requests.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"api not up; see {self.log}")

    def pids(self) -> set[int]:
        out = subprocess.run(["pgrep", "-g", str(self.proc.pid)], capture_output=True, text=True).stdout
        return {int(p) for p in out.split()}

    def kill_listeners(self, redis_url: str) -> int:
        """Cut every wake-up listener connection of this server's workers
        (CLIENT KILL by id: only ours, named asynch-wait-listener-<pid>)."""
        r = redis_lib.Redis.from_url(redis_url)
        names = {f"asynch-wait-listener-{p}" for p in self.pids()}
        killed = 0
        for c in r.client_list():
            if c.get("name") in names:
                killed += r.client_kill_filter(_id=c["id"])
        return killed

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            return None
        except ProcessLookupError:
            return None


def run_by_hand(job_id: str) -> None:
    """pending -> running (attempt 1), as a worker's claim does."""
    from app import transitions
    from app.clock import now
    from app.infra.db import transaction

    with transaction() as conn:
        assert transitions.claim(conn, job_id, 0, now() + timedelta(minutes=10)) is not None


def finish_by_hand(job_id: str) -> None:
    """running -> done, then the winner's effects (slot release + wake-up
    publish), as a worker's completion does."""
    from app import transitions
    from app.infra.db import transaction
    from app.jobs import effects

    with transaction() as conn:
        won = transitions.complete(conn, job_id, 1, location="x", content_type="application/json", size=0)
    assert won is not None
    effects.run(won)
