"""10,000 concurrent long-polls on one API host (issue "Capacity isolation",
part 1): wake-up latency, and another tenant's submit latency with and
without the waiters in the same run.

The stack: the API as `asynch api` runs it (gunicorn, gevent, 2 workers,
api_argv), PostgreSQL, Redis.  No Celery worker: jobs are moved by this
process through the same transitions a worker uses (claim; complete + the
terminal publish), so every job finishes at a time we choose and the
machine's 2 cores go to the API.

1. N jobs are submitted and claimed (running).
2. Tenant B alone: a separate process submits at a fixed rate for
   ``b_seconds``: its latency without waiters.
3. ``waiters`` clients (one asyncio/aiohttp process, spread over
   ``tenants`` tenants, ``waiters / jobs`` per job) open
   GET .../wait?timeout=120000 and park; then tenant B submits again while
   the jobs finish one by one over ``finish_seconds``.
4. Wake-up latency per waiter = its answer's arrival - the job's finished_at.

The same run under gthread (2 x 16 threads) is bounded in time: most waits
and submits never get a thread within it.

    python -m bench.bench_waiters                    # gevent, then gthread (bounded)
    python -m bench.bench_waiters --no-gthread --waiters 2000
    python -m bench.bench_waiters --wrk              # submit throughput, gthread vs gevent (wrk)

``main(...)`` is importable (bench/bench_fairness.py) and returns the figures.
Isolation on a shared machine: --db/--gate-db/--broker-db (BENCH_DB_NAME, BENCH_GATE_DB, BENCH_BROKER_DB).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
import threading
import time
from datetime import timedelta

from bench import stack

B_MODEL, A_MODEL = "bench-b", "bench-wait"


# --- the stack --------------------------------------------------------------------

def isolate(db: str | None = None, gate_db: int | None = None, broker_db: int | None = None) -> None:
    """Point bench/stack.py at our own database and Redis DBs (it reads its
    module constants at call time); the two spare DBs it flushes follow the gate's."""
    db = db or os.environ.get("BENCH_DB_NAME")
    gate_db = gate_db if gate_db is not None else (int(os.environ["BENCH_GATE_DB"])
                                                   if os.environ.get("BENCH_GATE_DB") else None)
    broker_db = broker_db if broker_db is not None else (int(os.environ["BENCH_BROKER_DB"])
                                                         if os.environ.get("BENCH_BROKER_DB") else None)
    if db:
        stack.DB_NAME = db
    if gate_db is not None:
        stack.GATE_DB = stack.COUNTER_DB = stack.NAIVE_BROKER_DB = gate_db
    if broker_db is not None:
        stack.BROKER_DB = broker_db


def _env_extra() -> dict:
    # Our own pub/sub channels: another stack on this Redis must not wake our listeners.
    return {"ASYNCH_REDIS_PREFIX": "asynch-bw"}


def start_api(worker_class: str, port: int, pool_size: int | None = 4, parking: bool = True) -> stack.Proc:
    from app.cli.processes import api_argv
    from app.config import get_settings
    from app.infra.metrics import group_env

    argv = api_argv(f"127.0.0.1:{port}", workers=2, threads=16, worker_class=worker_class)
    # The API publishes and listens where this process does (its prefix); a
    # small pool: greenlets queue on it, and PostgreSQL's connections are shared here.
    extra = {"ASYNCH_REDIS_PREFIX": get_settings().redis_prefix, "ASYNCH_LOG_LEVEL": "WARNING", **group_env()}
    if pool_size is not None:
        extra["ASYNCH_DB_POOL_SIZE"] = str(pool_size)
    extra["ASYNCH_WAIT_PARKING"] = "true" if parking else "false"
    p = stack.Proc(f"api-{worker_class}", argv, extra)
    p.wait_for(r"Booting worker with pid")
    stack._wait_http(port)
    return p


def _setup_jobs(jobs: int, tenants: int) -> tuple[list[str], dict[str, str], str]:
    """``jobs`` running jobs spread over ``tenants`` tenants; returns their
    ids, a key per tenant, tenant B's key."""
    from app import transitions
    from app.clock import now
    from app.errors import Conflict
    from app.infra.db import transaction
    from app.jobs import service as svc
    from app.tenancy.keys import Principal

    for m in (A_MODEL, B_MODEL):
        try:
            stack.create_model(m, "http://127.0.0.1:9", queue_limit=1_000_000)
        except Conflict:
            pass  # a previous run's (truncate_jobs keeps models)
    keys = {f"tenant-{i}": stack.create_key(f"tenant-{i}") for i in range(tenants)}
    ids, owner = [], {}
    for i in range(jobs):
        t = f"tenant-{i % tenants}"
        j = svc.submit(Principal(t, "user", None), A_MODEL, {"i": i}).row.id
        ids.append(j)
        owner[j] = t
    lease = now() + timedelta(hours=1)
    with transaction() as conn:
        for j in ids:
            transitions.claim(conn, j, 0, lease)
    return ids, {j: keys[owner[j]] for j in ids}, stack.create_key("tenant-b")


def _finish(ids: list[str], seconds: float) -> None:
    """Complete the jobs one by one, evenly over ``seconds``, as workers do."""
    from app import transitions
    from app.infra.db import transaction
    from app.jobs import service as svc

    t0 = time.monotonic()
    for n, j in enumerate(ids):
        delay = t0 + seconds * n / len(ids) - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        with transaction() as conn:
            won = transitions.complete(conn, j, 1, location="x", content_type="application/json", size=0)
        committed = time.time()  # the terminal state is durable (and visible) from here
        if won is not None:
            svc.after_terminal(won)
            print(j, f"{committed:.6f}", flush=False)
    sys.stdout.flush()


def finisher_process(ids: list[str], seconds: float) -> subprocess.Popen:
    """_finish in a process of its own (its timing must not share a GIL with
    the waiters' event loop); the ids go through stdin."""
    code = ("import sys; from app.config import load_settings, set_settings; set_settings(load_settings()); "
            f"from bench.bench_waiters import _finish; _finish(sys.stdin.read().split(), {seconds})")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=stack.ROOT, env={**stack.env(), **_env_extra_now()},
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p.stdin.write(" ".join(ids))
    p.stdin.close()
    return p


def _env_extra_now() -> dict:
    from app.config import get_settings

    return {"ASYNCH_REDIS_PREFIX": get_settings().redis_prefix}


def _finished_at(ids: list[str]) -> dict[str, float]:
    from sqlalchemy import select

    from app.clock import as_utc
    from app.infra.db import transaction
    from app.infra.tables import tasks

    out = {}
    with transaction() as conn:
        for i in range(0, len(ids), 1000):
            q = select(tasks.c.id, tasks.c.finished_at).where(tasks.c.id.in_(ids[i:i + 1000]))
            out.update((r.id, as_utc(r.finished_at).timestamp()) for r in conn.execute(q) if r.finished_at)
    return out


# --- tenant B: a paced submitter in its own process ---------------------------------------

def _tenant_b(url: str, key: str, seconds: float, rate: float, threads: int = 4) -> dict:
    import requests

    lat, errors, lock = [], [], threading.Lock()
    per_thread = rate / threads
    stop_at = time.monotonic() + seconds

    def loop(k: int) -> None:
        s = requests.Session()
        nxt = time.monotonic() + k / rate
        while nxt < stop_at:
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t0 = time.monotonic()
            try:
                r = s.post(url, json={"x": 1}, headers={"Authorization": f"Bearer {key}"}, timeout=10)
                ok = r.status_code == 202
            except requests.RequestException as exc:
                ok, r = False, exc
            took = time.monotonic() - t0
            with lock:
                (lat if ok else errors).append(took if ok else repr(r)[:80])
            nxt += 1 / per_thread
            if nxt < time.monotonic():  # never burst to catch up: a stalled server is what we measure
                nxt = time.monotonic()

    ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"n": len(lat), "errors": len(errors), "first_errors": errors[:3],
            "p50_ms": stack.pct(lat, 50) * 1000, "p99_ms": stack.pct(lat, 99) * 1000,
            "max_ms": max(lat) * 1000 if lat else float("nan")}


def tenant_b_process(api: str, key: str, seconds: float, rate: float) -> subprocess.Popen:
    code = ("import json, sys; from bench.bench_waiters import _tenant_b; "
            f"print(json.dumps(_tenant_b({api + '/v1/models/' + B_MODEL + '/jobs'!r}, {key!r}, {seconds}, {rate})))")
    return subprocess.Popen([sys.executable, "-c", code], cwd=stack.ROOT, env={**stack.env(), **_env_extra_now()},
                            stdout=subprocess.PIPE, text=True)


def _b_result(p: subprocess.Popen, timeout: float) -> dict:
    out, _ = p.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


def _cpu(pids) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / tick
        except (OSError, IndexError):
            pass
    return total


def _pids_of(name: str) -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()]


def _cpu_snapshot(api: stack.Proc) -> dict[str, float]:
    return {"api": _cpu(api.pids()), "bench (waiters + finisher)": _cpu([os.getpid()]),
            "postgres (all)": _cpu(_pids_of("postgres")), "redis": _cpu(_pids_of("redis-server"))}


# --- the waiters: one asyncio process ----------------------------------------------------

def _raise_nofile(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Waiters:
    """``len(targets)`` concurrent waits, opened at ``ramp_per_s``, run on
    an event loop in a thread; ``answers`` holds (job, arrival, state)."""

    def __init__(self, api: str, targets: list[tuple[str, str]], ramp_per_s: float = 1500,
                 budget_ms: int = 120000) -> None:
        self.api, self.targets, self.ramp, self.budget_ms = api, targets, ramp_per_s, budget_ms
        self.answers: list[tuple[str, float, str]] = []
        self.sent = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._run(),), daemon=True)

    def start(self) -> "Waiters":
        _raise_nofile(len(self.targets) + 1000)
        self.thread.start()
        return self

    async def _run(self) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.budget_ms / 1000 + 60)
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
            async def one(job: str, key: str) -> None:
                url = f"{self.api}/v1/models/{A_MODEL}/jobs/{job}/wait?timeout={self.budget_ms}"
                try:
                    async with s.get(url, headers={"Authorization": f"Bearer {key}"}) as r:
                        body = await r.read()
                        state = json.loads(body).get("state", str(r.status)) if r.status == 200 else str(r.status)
                except Exception as exc:  # counted as an answer that is not "done"
                    state = type(exc).__name__
                self.answers.append((job, time.time(), state))

            tasks = []
            t0 = time.monotonic()
            for n, (job, key) in enumerate(self.targets):
                delay = t0 + n / self.ramp - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one(job, key)))
                self.sent = n + 1
            self._pending = tasks
            await asyncio.gather(*tasks)

    def join(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


# --- one run --------------------------------------------------------------------------

def run(worker_class: str, waiters: int, jobs: int, tenants: int, finish_seconds: float, b_seconds: float,
        b_rate: float, bound_seconds: float | None = None, parking: bool = True) -> dict:
    """One configuration; ``parking`` False: gevent keeps a greenlet per wait
    (ASYNCH_WAIT_PARKING=false), the serving path before app/infra/parking.py."""
    label = worker_class if parking or worker_class != "gevent" else "gevent-unparked"
    stack.truncate_jobs()
    stack.flush_redis()
    port = stack.free_port()
    api_url = f"http://127.0.0.1:{port}"
    ids, key_of, key_b = _setup_jobs(jobs, tenants)
    api = start_api(worker_class, port, parking=parking)
    try:
        base = _b_result(tenant_b_process(api_url, key_b, b_seconds, b_rate), b_seconds + 60)
        print(f"  [{label}] tenant B alone: p50 {base['p50_ms']:.1f} ms  p99 {base['p99_ms']:.1f} ms "
              f"(n={base['n']}, errors {base['errors']})", flush=True)
        per_job = max(1, waiters // jobs)
        targets = [(j, key_of[j]) for j in ids for _ in range(per_job)][:waiters]
        w = Waiters(api_url, targets).start()
        t_ramp = time.monotonic()
        while w.sent < len(targets) and time.monotonic() - t_ramp < 120:
            time.sleep(0.2)
        ramp_s = time.monotonic() - t_ramp
        # Parked = the API has read every new wait's job: its processes go
        # quiet.  (A burst of 10,000 new waits is work -- auth, a read each --
        # that must not be counted as the cost of keeping them.)
        settle = time.monotonic()
        while time.monotonic() - settle < 90:
            c0 = _cpu(api.pids())
            time.sleep(1.0)
            if _cpu(api.pids()) - c0 < 0.1:
                break
        settle_s = time.monotonic() - settle
        rss_parked = sum(api.rss_mb())
        answered_early = len(w.answers)
        print(f"  [{label}] {w.sent} waits opened in {ramp_s:.1f} s, API quiet {settle_s:.1f} s later; "
              f"{answered_early} answered before any job ended; API RSS {rss_parked:.0f} MB", flush=True)
        cpu0, t0 = _cpu_snapshot(api), time.monotonic()
        # The client's own garbage collector must not pause the clock we read
        # arrivals with (10,000 tasks make a slow full collection): off while measuring.
        gc.freeze()
        gc.disable()
        b = tenant_b_process(api_url, key_b, b_seconds, b_rate)
        finisher = finisher_process(ids, finish_seconds)
        loaded = _b_result(b, b_seconds + 60)
        out_text = finisher.stdout.read()  # until the finisher exits
        finisher.wait(finish_seconds + 120)
        committed = {j: float(t) for j, t in (ln.split() for ln in out_text.splitlines() if ln.strip())}
        cpu1, wall = _cpu_snapshot(api), time.monotonic() - t0
        cpu = {k: round((cpu1[k] - cpu0[k]) / wall, 2) for k in cpu0}
        print(f"  [{label}] cores used while the jobs finished ({wall:.0f} s): {cpu}", flush=True)
        done_all = w.join(bound_seconds if bound_seconds is not None else 120)
        gc.enable()
        fin = _finished_at(ids)
        lat = [(at - fin[j]) * 1000 for j, at, st in list(w.answers) if st == "done" and j in fin]
        # The wake-up proper: from the moment the terminal commit returned to
        # the answer's arrival.  (finished_at is set in the UPDATE, before
        # the commit: a slow commit -- an fsync stall -- counts in ``lat``.)
        lat_c = [(at - committed[j]) * 1000 for j, at, st in list(w.answers) if st == "done" and j in committed]
        commit_ms = [(committed[j] - fin[j]) * 1000 for j in committed if j in fin]
        not_done = sum(1 for _, _, st in list(w.answers) if st != "done")
        out = {
            "worker_class": label, "waiters": len(targets), "jobs": jobs, "ramp_s": ramp_s, "settle_s": settle_s,
            "answered": len(w.answers), "unanswered_at_bound": len(targets) - len(w.answers),
            "not_done": not_done, "all_answered": done_all,
            "wake_p50_ms": stack.pct(lat, 50), "wake_p99_ms": stack.pct(lat, 99),
            "wake_max_ms": max(lat) if lat else float("nan"),
            "wake_commit_p50_ms": stack.pct(lat_c, 50), "wake_commit_p99_ms": stack.pct(lat_c, 99),
            "commit_p99_ms": stack.pct(commit_ms, 99), "commit_max_ms": max(commit_ms) if commit_ms else float("nan"),
            "b_alone": base, "b_loaded": loaded, "b_p99_ratio": loaded["p99_ms"] / base["p99_ms"],
            "api_rss_mb": rss_parked, "cores_used": cpu,
        }
        by_second: dict[int, list[float]] = {}
        t_first = min(fin.values()) if fin else 0
        for j, at, st in list(w.answers):
            if st == "done" and j in fin:
                by_second.setdefault(int((fin[j] - t_first) // 5) * 5, []).append((at - fin[j]) * 1000)
        print("  [" + label + "] wake-up p99 by finish time: " + ", ".join(
            f"{k}-{k + 5}s {stack.pct(v, 99):.0f} ms" for k, v in sorted(by_second.items())), flush=True)
        print(f"  [{label}] from the terminal commit: wake-up p50 {out['wake_commit_p50_ms']:.1f} ms  p99 "
              f"{out['wake_commit_p99_ms']:.1f} ms (the finisher's commits themselves: p99 {out['commit_p99_ms']:.1f} ms, "
              f"max {out['commit_max_ms']:.0f} ms after finished_at)", flush=True)
        print(f"  [{label}] wake-up p50 {out['wake_p50_ms']:.1f} ms  p99 {out['wake_p99_ms']:.1f} ms  max "
              f"{out['wake_max_ms']:.0f} ms (n={len(lat)}, not done {not_done}, unanswered "
              f"{out['unanswered_at_bound']}); tenant B with the waiters: p50 {loaded['p50_ms']:.1f} ms p99 "
              f"{loaded['p99_ms']:.1f} ms (n={loaded['n']}, errors {loaded['errors']}) = "
              f"{out['b_p99_ratio']:.2f}x alone", flush=True)
        return out
    finally:
        api.stop()


def main(waiters: int = 10_000, jobs: int = 2_000, tenants: int = 20, finish_seconds: float = 20.0,
         b_seconds: float = 20.0, b_rate: float = 50.0, gthread: bool = True, gthread_bound_seconds: float = 30.0,
         db: str | None = None, gate_db: int | None = None, broker_db: int | None = None,
         prepare: bool = True, unparked: bool = False) -> dict:
    """The figures of one gevent run (and a bounded gthread run; with
    ``unparked`` first a gevent run with a greenlet per wait, the baseline
    of parking).  ``prepare``:
    recreate the database and settings (False when the caller already did)."""
    isolate(db, gate_db, broker_db)
    if prepare:
        stack.fresh(**_env_extra())
        from app.infra.db import reset_engine
        from app.infra.redis.client import reset_redis

        reset_engine()
        reset_redis()
    out = {}
    if unparked:
        u = out["gevent-unparked"] = run("gevent", waiters, jobs, tenants, finish_seconds, b_seconds, b_rate,
                                         parking=False)
    out["gevent"] = run("gevent", waiters, jobs, tenants, finish_seconds, b_seconds, b_rate)
    g = out["gevent"]
    print(f"waiters ({g['waiters']} on {jobs} jobs, 2 gevent workers): wake-up from the commit p50 "
          f"{g['wake_commit_p50_ms']:.1f} ms p99 {g['wake_commit_p99_ms']:.1f} ms (from finished_at p99 "
          f"{g['wake_p99_ms']:.1f} ms) | tenant B submit p99 {g['b_alone']['p99_ms']:.1f} ms alone, "
          f"{g['b_loaded']['p99_ms']:.1f} ms with the waiters ({g['b_p99_ratio']:.2f}x)", flush=True)
    if unparked:
        print(f"baseline, a greenlet per wait (ASYNCH_WAIT_PARKING=false), same run: wake-up from the commit p99 "
              f"{u['wake_commit_p99_ms']:.1f} ms | tenant B submit p99 {u['b_alone']['p99_ms']:.1f} ms alone, "
              f"{u['b_loaded']['p99_ms']:.1f} ms with the waiters ({u['b_p99_ratio']:.2f}x) | API RSS parked "
              f"{u['api_rss_mb']:.0f} MB vs {g['api_rss_mb']:.0f} MB parked", flush=True)
    if gthread:
        t = out["gthread"] = run("gthread", waiters, jobs, tenants, finish_seconds, b_seconds, b_rate,
                                 bound_seconds=gthread_bound_seconds)
        print(f"gthread (2 x 16 threads, bounded at {gthread_bound_seconds:.0f} s after the last finish): "
              f"{t['answered']} of {t['waiters']} waits answered, wake-up p99 {t['wake_p99_ms']:.0f} ms | "
              f"tenant B submit p99 {t['b_alone']['p99_ms']:.1f} ms alone, {t['b_loaded']['p99_ms']:.0f} ms "
              f"with the waiters ({t['b_loaded']['errors']} of {t['b_loaded']['n'] + t['b_loaded']['errors']} "
              f"failed at the 10 s client timeout)", flush=True)
    return out


def submit_throughput(seconds: int = 10, connections: int = 32, runs: int = 3, db: str | None = None,
                      gate_db: int | None = None, broker_db: int | None = None) -> dict:
    """Plain submissions (wrk, ``connections`` keep-alive connections) under
    gthread (2 x 16) and gevent (2 workers), medians of ``runs``."""
    from bench.wrk import run_wrk

    isolate(db, gate_db, broker_db)
    stack.fresh(**_env_extra())
    stack.create_model(B_MODEL, "http://127.0.0.1:9", queue_limit=1_000_000)
    key = stack.create_key("tenant-b")
    res: dict[str, list] = {"gthread": [], "gevent": []}
    for i in range(runs):
        for wc in ("gthread", "gevent"):
            port = stack.free_port()
            api = start_api(wc, port, pool_size=None)  # the default pool: what production runs
            try:
                r = run_wrk(f"http://127.0.0.1:{port}/v1/models/{B_MODEL}/jobs", json.dumps({"x": 1}),
                            {"Authorization": f"Bearer {key}"}, connections=connections, seconds=seconds)
            finally:
                api.stop()
            r.pop("raw")
            res[wc].append(r)
            print(f"  run {i + 1} {wc:7s}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms "
                  f" non-2xx {r['non_2xx']} {r['socket_errors']}", flush=True)
            stack.truncate_jobs()
            stack.flush_redis()
    summary = {k: {m: stack.median([x[m] for x in v]) for m in ("rps", "p50_ms", "p99_ms")} for k, v in res.items()}
    print(f"submit throughput ({connections} connections): gthread {summary['gthread']['rps']:.0f} req/s p99 "
          f"{summary['gthread']['p99_ms']:.1f} ms | gevent {summary['gevent']['rps']:.0f} req/s p99 "
          f"{summary['gevent']['p99_ms']:.1f} ms | gevent/gthread {summary['gevent']['rps'] / summary['gthread']['rps']:.2f}x")
    return summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waiters", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=2_000)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--finish-seconds", type=float, default=20.0)
    ap.add_argument("--b-seconds", type=float, default=20.0)
    ap.add_argument("--b-rate", type=float, default=50.0)
    ap.add_argument("--no-gthread", action="store_true")
    ap.add_argument("--unparked", action="store_true",
                    help="first the same run with a greenlet per wait (ASYNCH_WAIT_PARKING=false): parking's baseline")
    ap.add_argument("--wrk", action="store_true", help="submit throughput, gthread vs gevent, instead")
    ap.add_argument("--db")
    ap.add_argument("--gate-db", type=int)
    ap.add_argument("--broker-db", type=int)
    a = ap.parse_args()
    if a.wrk:
        submit_throughput(db=a.db, gate_db=a.gate_db, broker_db=a.broker_db)
    else:
        main(a.waiters, a.jobs, a.tenants, a.finish_seconds, a.b_seconds, a.b_rate, gthread=not a.no_gthread,
             db=a.db, gate_db=a.gate_db, broker_db=a.broker_db, unparked=a.unparked)
    sys.exit(0)
