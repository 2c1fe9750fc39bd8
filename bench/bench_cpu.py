"""Where the CPU goes: CPU time per request (admission) and per job (end to
end) by process group, ours beside the baseline, read from /proc (user +
system time of every process) while the load runs, plus how idle the whole
machine was.  This is the profile behind docs/performance.md, "End to end" (CPU per
job): on two shared cores, throughput is total CPU per job.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import redis

from bench import stack
from bench.wrk import run_wrk

N = int(os.environ.get("BENCH_CPU_JOBS", "2000"))


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def _pgrep(*args: str) -> list[int]:
    return [int(x) for x in subprocess.run(["pgrep", *args], capture_output=True, text=True).stdout.split()]


def _machine() -> tuple[int, int]:
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return v[3] + v[4], sum(v)  # idle + iowait, total


class Meter:
    """CPU seconds of named process groups between start() and stop()."""

    def __init__(self, groups: dict) -> None:
        self.groups = groups  # name -> callable returning pids (re-read: backends come and go)

    def start(self) -> None:
        self.pids = {k: f() for k, f in self.groups.items()}
        self.c0 = {k: _cpu_seconds(p) for k, p in self.pids.items()}
        self.m0 = _machine()

    def stop(self, units: float) -> dict:
        # Processes that started meanwhile (new PostgreSQL backends) count from zero.
        out = {}
        for k, f in self.groups.items():
            now = set(f())
            before = self.c0[k] - _cpu_seconds([p for p in self.pids[k] if p not in now])
            out[f"{k}_ms"] = (_cpu_seconds(list(now)) - before) / units * 1000
        m1 = _machine()
        out["machine_idle_pct"] = 100 * (m1[0] - self.m0[0]) / max(1, m1[1] - self.m0[1])
        return out


def _services() -> dict:
    return {"postgres": lambda: _pgrep("-u", "postgres"), "redis": lambda: _pgrep("redis-server")}


def admission() -> dict:
    stack.create_model("bench-echo", "http://127.0.0.1:9")
    key = stack.create_key()
    body = json.dumps({"prompt": "hello", "n": 1})
    out = {}
    for name, target, path, hdr in (
            ("naive", "bench.naive:naive_app", "/jobs", {}),
            ("ours", "app.wsgi:app", "/v1/models/bench-echo/jobs", {"Authorization": f"Bearer {key}"})):
        api = stack.gunicorn(f"cpu-{name}", target, port := stack.free_port())
        try:
            url = f"http://127.0.0.1:{port}{path}"
            run_wrk(url, body, hdr, seconds=3)  # warm-up
            m = Meter({"api": api.pids, **_services()})
            m.start()
            r = run_wrk(url, body, hdr, seconds=10)
            out[name] = {"rps": r["rps"], **m.stop(r["rps"] * 10)}
        finally:
            api.stop()
        print(f"  admission {name:5s}: {out[name]['rps']:.0f} req/s; CPU per request: API {out[name]['api_ms']:.2f} ms,"
              f" PostgreSQL {out[name]['postgres_ms']:.2f} ms, Redis {out[name]['redis_ms']:.2f} ms;"
              f" machine idle {out[name]['machine_idle_pct']:.0f}%", flush=True)
    return out


def end_to_end() -> dict:
    from bench.bench_e2e import _done_ours, _fill_ours
    from bench.naive import http_call

    stack.truncate_jobs()
    stack.flush_redis()
    mport = stack.free_port()
    model = stack.stub_model(mport)
    stack.create_model("bench-model", f"http://127.0.0.1:{mport}", route="/bench")
    counter = stack.redis_db(stack.COUNTER_DB)
    out = {}
    try:
        for name in ("naive", "ours"):
            if name == "ours":
                _fill_ours(N, model="bench-model")
                worker = stack.celery_worker("cpu-worker", "workers.celery_app", "asynch-bench")
                done = _done_ours
            else:
                for j in range(N):
                    http_call.delay(f"http://127.0.0.1:{mport}/bench", {"i": j})
                worker = stack.celery_worker("cpu-naive-worker", "bench.naive", "naive")
                done = lambda: int(counter.get("naive:done") or 0)  # noqa: E731
            m = Meter({"worker": worker.pids, "model": model.pids, **_services()})
            try:
                m.start()
                t0 = time.monotonic()
                while done() < N:
                    time.sleep(0.02)
                rate = N / (time.monotonic() - t0)
                out[name] = {"jobs_s": rate, **m.stop(N)}
            finally:
                worker.stop()
            print(f"  end to end {name:5s}: {rate:.0f} jobs/s; CPU per job: worker {out[name]['worker_ms']:.2f} ms,"
                  f" PostgreSQL {out[name]['postgres_ms']:.2f} ms, Redis {out[name]['redis_ms']:.2f} ms,"
                  f" stub model {out[name]['model_ms']:.2f} ms; machine idle {out[name]['machine_idle_pct']:.0f}%",
                  flush=True)
    finally:
        model.stop()
    return out


def main() -> dict:
    stack.fresh()

    return {"admission": admission(), "end_to_end": end_to_end()}


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
