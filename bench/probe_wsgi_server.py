"""Probe, not a benchmark of record: our admission under granian (WSGI, 2 workers x 16 or 4 threads)
beside gunicorn gevent (what `asynch api` runs) and the bare .delay() endpoint, interleaved in one run.
It asks whether "a faster WSGI server" (issue 25, goal 3) is the way to the admission target.

    pip install --target /tmp/granian granian
    BENCH_OWN_SERVERS=1 PYTHONPATH=.:/tmp/granian .venv/bin/python -m bench.probe_wsgi_server
"""
from __future__ import annotations

import json
import os
import sys

from bench import stack
from bench.bench_admission import _naive, _ours
from bench.wrk import run_wrk


def _granian(name: str, port: int, threads: int) -> stack.Proc:
    from app.infra.metrics import group_env

    p = stack.Proc(name, [sys.executable, "-m", "granian", "--interface", "wsgi", "--workers", "2",
                          "--blocking-threads", str(threads), "--host", "127.0.0.1", "--port", str(port),
                          "--backlog", "2048", "--no-ws", "app.wsgi:app"],
                   {"ASYNCH_LOG_LEVEL": "WARNING", "PYTHONPATH": os.pathsep.join(sys.path), **group_env()})
    stack._wait_http(port)
    return p


def main() -> None:
    stack.fresh()
    stack.create_model("bench-echo", "http://127.0.0.1:9")
    key = stack.create_key()
    body = json.dumps({"prompt": "hello", "n": 1})
    servers = {}
    try:
        for name, start in (("ours-gevent", lambda n, p: _ours(n, p, "gevent")),
                            ("ours-granian16", lambda n, p: _granian(n, p, 16)),
                            ("ours-granian4", lambda n, p: _granian(n, p, 4)),
                            ("naive-gevent", lambda n, p: _naive(n, p, "gevent"))):
            port = stack.free_port()
            proc = start(name, port)
            ours = name.startswith("ours")
            url = f"http://127.0.0.1:{port}" + ("/v1/models/bench-echo/jobs" if ours else "/jobs")
            servers[name] = (proc, url, {"Authorization": f"Bearer {key}"} if ours else {})
        for i in range(int(os.environ.get("BENCH_RUNS", "2"))):
            for name, (_p, url, hdr) in servers.items():
                r = run_wrk(url, body, hdr, seconds=10)
                print(f"run {i + 1} {name:15s} {r['rps']:8.1f} req/s  p50 {r['p50_ms']:.1f} ms  "
                      f"p99 {r['p99_ms']:.1f} ms  non-2xx {r['non_2xx']} {r['socket_errors']}", flush=True)
            stack.truncate_jobs()
            stack.flush_redis()
    finally:
        for p, _u, _h in servers.values():
            p.stop()


if __name__ == "__main__":
    main()
