"""Streamed output, measured (issue 31 item 4), beside its baseline in the same run: BENCH_STREAMS (100)
concurrent streaming jobs, each BENCH_CHUNKS (100) chunks at 20 chunks/s, read through
`GET /v1/models/{model}/jobs/{id}/stream` from `asynch api` (gevent, 2 workers), one Celery node (2 processes,
default ASYNCH_WORKER_SLOTS), the demo model (its own process) streaming chat.completion.chunk events stamped
with their send time.

  direct  the same number of streams read from the demo model itself, each chunk's arrival minus its stamp:
          what the machine adds with no middleware (the baseline)
  ours    each chunk's arrival at the stream's client minus its stamp: p50 / p99 (goal: p99 at most 50 ms
          above direct's), and CPU per chunk (API + worker processes, user + system) over the run

Usage: PYTHONPATH=. python -m bench.bench_stream   (BENCH_REDIS / BENCH_DB for a private Redis / database)
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import requests

from bench import stack

STREAMS = int(os.environ.get("BENCH_STREAMS", "100"))
CHUNKS = int(os.environ.get("BENCH_CHUNKS", "100"))
CHUNK_MS = 50
PAYLOAD = {"stream": True, "stamp": True, "chunks": CHUNKS, "chunk_ms": CHUNK_MS,
           "messages": [{"role": "user", "content": "a streamed answer of several words"}]}


def _lines(resp):
    buf = b""
    for chunk in resp.iter_content(chunk_size=None):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield from lines


def _stamps_in(line: bytes) -> float | None:
    """The send time of the chunk a line carries (``data: {...,"t":...}``), None for other lines."""
    i = line.find(b'"t":')
    if i < 0:
        return None
    return float(line[i + 4:].split(b",")[0].split(b"}")[0])


def direct(stub_url: str) -> list[float]:
    lags: list[float] = []
    lock = threading.Lock()

    def one():
        got = []
        with requests.post(f"{stub_url}/v1/chat/completions", json=PAYLOAD, stream=True, timeout=120) as r:
            for line in _lines(r):
                t = _stamps_in(line)
                if t is not None:
                    got.append(time.time() - t)
        with lock:
            lags.extend(got)

    _run_all(one)
    return lags


def ours(api: str, key: str) -> tuple[list[float], int]:
    lags: list[float] = []
    lock = threading.Lock()
    auth = {"Authorization": f"Bearer {key}"}
    done = [0]

    def one():
        job = requests.post(f"{api}/v1/models/chat/jobs", json=PAYLOAD, headers=auth, timeout=30).json()["job_id"]
        got = []
        with requests.get(f"{api}/v1/models/chat/jobs/{job}/stream", headers=auth, stream=True, timeout=120) as r:
            for line in _lines(r):
                t = _stamps_in(line)
                if t is not None:
                    got.append(time.time() - t)
                elif line.startswith(b"id: end"):
                    break
        with lock:
            lags.extend(got)
            done[0] += 1

    _run_all(one)
    return lags, done[0]


def _run_all(fn) -> None:
    threads = [threading.Thread(target=fn, daemon=True) for _ in range(STREAMS)]
    for t in threads:
        t.start()
        time.sleep(0.005)  # a little spread, as real clients have
    for t in threads:
        t.join(300)


def _cpu(pids: list[int]) -> float:
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (FileNotFoundError, IndexError):
            pass
    return total


def main() -> None:
    stack.fresh()
    stub_port, api_port = stack.free_port(), stack.free_port()
    stub = stack.stub_model(stub_port)
    stub_url = f"http://127.0.0.1:{stub_port}"
    stack.create_model("chat", stub_url, route="/v1/chat/completions", streaming=True, max_concurrency=STREAMS,
                       queue_limit=10_000, timeout_seconds=120)
    key = stack.create_key("bench")
    api = stack.Proc("stream-api", [sys.executable, "-m", "app.cli", "api", "--bind", f"127.0.0.1:{api_port}"])
    stack._wait_http(api_port)
    worker = stack.celery_worker("stream-worker", "workers.celery_app", "asynch-bench", 2)
    try:
        base = direct(stub_url)
        before = {n: _cpu(p.pids()) for n, p in (("api", api), ("worker", worker))}
        lags, done = ours(f"http://127.0.0.1:{api_port}", key)
        spent = {n: _cpu(p.pids()) - before[n] for n, p in (("api", api), ("worker", worker))}
    finally:
        worker.stop()
        api.stop()
        stub.stop()
    chunks = max(1, len(lags))
    out = {"streams": STREAMS, "chunks_per_stream": CHUNKS, "chunks_per_second": 1000 / CHUNK_MS,
           "direct_p50_ms": stack.pct(base, 50) * 1000, "direct_p99_ms": stack.pct(base, 99) * 1000,
           "ours_p50_ms": stack.pct(lags, 50) * 1000, "ours_p99_ms": stack.pct(lags, 99) * 1000,
           "streams_done": done, "chunks_seen": len(lags), "chunks_expected": STREAMS * CHUNKS,
           "cpu_us_per_chunk": {n: s / chunks * 1e6 for n, s in spent.items()}}
    out["added_p99_ms"] = out["ours_p99_ms"] - out["direct_p99_ms"]
    print(f"{STREAMS} streams x {CHUNKS} chunks at {1000 / CHUNK_MS:.0f}/s; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"direct (baseline): chunk latency p50 {out['direct_p50_ms']:.1f} ms  p99 {out['direct_p99_ms']:.1f} ms")
    print(f"ours (stream_url): chunk latency p50 {out['ours_p50_ms']:.1f} ms  p99 {out['ours_p99_ms']:.1f} ms  "
          f"(added p99 {out['added_p99_ms']:.1f} ms; goal <= 50 ms); {done}/{STREAMS} streams ended, "
          f"{len(lags)}/{STREAMS * CHUNKS} chunks seen")
    print("CPU per chunk: " + ", ".join(f"{n} {v:.0f} us" for n, v in out["cpu_us_per_chunk"].items())
          + f" (total {sum(out['cpu_us_per_chunk'].values()):.0f} us)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
