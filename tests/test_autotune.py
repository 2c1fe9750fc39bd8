"""Autotune: the pure rule on synthetic histories (every branch), then runs
over real finished jobs in PostgreSQL writing real Redis keys."""
from __future__ import annotations

import threading
from datetime import timedelta

from helpers import auth
from sqlalchemy import insert, select

from app.clock import now, set_clock
from app.infra.db import transaction
from app.infra.tables import autotune_log, tasks
from app.maintenance import autotune as at
from app.maintenance.autotune import Inputs, Limits, decide
from app.states import JobState

CAPS = Limits(max_concurrency=8, queue_limit=40)


def rule(inputs: Inputs, current: Limits = Limits(4, 20), caps: Limits = CAPS, expected: float = 10,
         timeout: float = 60, min_samples: int = 5):
    return decide(inputs, current=current, caps=caps, expected_seconds=expected, timeout_seconds=timeout,
                  min_samples=min_samples)


def test_too_few_samples_changes_nothing():
    d = rule(Inputs(samples=4, p90_seconds=100, throughput_per_second=1, queued=4))
    assert d.action == "skip" and d.new is None and "at least 5" in d.reason


def test_saturating_model_halves_concurrency_down_to_one():
    d = rule(Inputs(samples=50, p90_seconds=12, throughput_per_second=0.01, queued=50))
    assert d.action == "decrease" and d.new.max_concurrency == 2
    d = rule(Inputs(samples=50, p90_seconds=12, throughput_per_second=0.01), current=Limits(5, 20))
    assert d.new.max_concurrency == 2  # floor(5 * 0.5)
    d = rule(Inputs(samples=50, p90_seconds=99, throughput_per_second=0.01), current=Limits(1, 20))
    assert d.new.max_concurrency == 1  # never below 1


def test_queued_demand_within_expectation_adds_one_up_to_the_cap():
    d = rule(Inputs(samples=50, p90_seconds=5, throughput_per_second=0.5, queued=3))
    assert d.action == "increase" and d.new.max_concurrency == 5
    d = rule(Inputs(samples=50, p90_seconds=5, throughput_per_second=0.5, queued=3), current=Limits(8, 20))
    assert d.new.max_concurrency == 8  # at the cap already


def test_no_demand_holds_concurrency():
    d = rule(Inputs(samples=50, p90_seconds=5, throughput_per_second=0.5, queued=0))
    assert d.action == "hold" and d.new.max_concurrency == 4


def test_queue_limit_follows_littles_law_clamped_to_one_and_the_cap():
    # X = max(observed 0.2/s, c/P90 = 4/5 = 0.8/s); B = 30 s -> L = 24.
    d = rule(Inputs(samples=50, p90_seconds=5, throughput_per_second=0.2), timeout=30)
    assert d.new.queue_limit == 24
    # Observed throughput above the P90 estimate wins: 2/s * 30 s = 60 -> cap 40.
    d = rule(Inputs(samples=50, p90_seconds=5, throughput_per_second=2.0), timeout=30)
    assert d.new.queue_limit == CAPS.queue_limit
    # A model far slower than its budget: never below 1.
    d = rule(Inputs(samples=50, p90_seconds=600, throughput_per_second=0.0001), expected=1000, timeout=60,
             current=Limits(1, 20))
    assert d.new == Limits(1, 1)
    # Halving concurrency shrinks the queue with it: X = 2/12 s, B = 60 s -> 10.
    d = rule(Inputs(samples=50, p90_seconds=12, throughput_per_second=0.01))
    assert d.new == Limits(2, 10)


def test_caps_are_respected_even_when_the_override_is_above_them():
    d = rule(Inputs(samples=50, p90_seconds=1, throughput_per_second=5, queued=9), current=Limits(50, 500))
    assert d.old == CAPS and d.new.max_concurrency <= CAPS.max_concurrency
    assert d.new.queue_limit <= CAPS.queue_limit
    closed = rule(Inputs(samples=50, p90_seconds=1), caps=Limits(4, 0))
    assert closed.action == "skip" and closed.new is None


def test_p90_is_nearest_rank():
    assert at.p90([float(x) for x in range(1, 11)]) == 9.0
    assert at.p90([3.0]) == 3.0
    assert at.p90([1.0] * 9 + [100.0]) == 1.0
    assert at.p90([1.0] * 8 + [100.0] * 2) == 100.0


# --- over real rows ---------------------------------------------------------------------------

def finished_jobs(model: str, durations: list[float], *, waited: float = 0.0, ago: float = 60.0,
                  state: JobState = JobState.DONE) -> None:
    t = now()
    rows = []
    for i, d in enumerate(durations):
        end = t - timedelta(seconds=ago + i)
        start = end - timedelta(seconds=d)
        rows.append(dict(id=f"job_{model}_{ago}_{state.label}_{i}", tenant_id="t", model_name=model, request_payload="{}",
                         request_hash="h", state=int(state), attempt=1, created_at=start,
                         enqueue_at=start - timedelta(seconds=waited), started_at=start, finished_at=end,
                         updated_at=end))
    with transaction() as conn:
        conn.execute(insert(tasks), rows)


def log_rows() -> list:
    with transaction() as conn:
        return conn.execute(select(autotune_log).order_by(autotune_log.c.id)).all()


def test_run_over_finished_jobs_writes_limits_with_ttl_and_logs(make_model, r, settings):
    make_model("slowpoke", max_concurrency=6, queue_limit=30, expected_seconds=2, timeout_seconds=20)
    make_model("quick", max_concurrency=3, queue_limit=50, expected_seconds=5, timeout_seconds=10)
    make_model("idle", max_concurrency=3, queue_limit=50)
    finished_jobs("slowpoke", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])              # P90 9 s > 2 s
    finished_jobs("quick", [0.5] * 12, waited=3)                             # queued, fast
    finished_jobs("quick", [30] * 5, ago=7200)                               # outside the window
    finished_jobs("slowpoke", [1] * 3, state=JobState.FAILED)                # not done: not a sample
    finished_jobs("idle", [1, 1, 1])                                          # too few
    r.set("asynch:runtime:max_concurrency:{quick}", "2")                       # an earlier decrease

    rep = at.autotune().as_dict()
    by = {m["model"]: m for m in rep["models"]}
    assert by["slowpoke"]["action"] == "decrease" and by["slowpoke"]["new"] == {"max_concurrency": 3,
                                                                                 "queue_limit": 6}
    assert by["slowpoke"]["inputs"]["samples"] == 10 and by["slowpoke"]["inputs"]["p90_seconds"] == 9.0
    assert by["quick"]["action"] == "increase" and by["quick"]["old"]["max_concurrency"] == 2
    assert by["quick"]["new"] == {"max_concurrency": 3, "queue_limit": 50}  # 3 / 0.5 s * 10 s = 60 > cap
    assert by["quick"]["inputs"]["queued"] == 12 and by["quick"]["inputs"]["samples"] == 12
    assert by["idle"]["action"] == "skip"
    assert r.get("asynch:runtime:max_concurrency:{slowpoke}") == "3"
    assert r.get("asynch:runtime:queue_limit:{slowpoke}") == "6"
    ttl = r.ttl("asynch:runtime:queue_limit:{slowpoke}")
    assert settings.autotune_ttl_seconds - 5 <= ttl <= settings.autotune_ttl_seconds
    assert r.ttl("asynch:runtime:max_concurrency:{quick}") > 0
    assert r.get("asynch:runtime:queue_limit:{idle}") is None

    logged = {x.model_name: x for x in log_rows()}
    assert set(logged) == {"slowpoke", "quick"}  # idle did not change
    assert (logged["quick"].old_max_concurrency, logged["quick"].new_max_concurrency) == (2, 3)
    s = logged["slowpoke"]
    assert (s.old_max_concurrency, s.new_max_concurrency, s.old_queue_limit, s.new_queue_limit) == (6, 3, 30, 6)
    assert s.p90_seconds == 9.0 and s.samples == 10 and s.window_seconds == 3600 and s.action == "decrease"

    # The gate obeys the new queue limit at once.
    from app.infra.redis import gate

    decisions = [gate.gate_admit("slowpoke", "t", f"j{i}", 30).admitted for i in range(8)]
    assert decisions.count(True) == 6

    # Right after a change there is no evidence about it yet: nothing moves.
    rep = at.autotune().as_dict()
    assert {m["model"]: m for m in rep["models"]}["slowpoke"]["action"] == "skip"
    assert r.get("asynch:runtime:max_concurrency:{slowpoke}") == "3"
    # Jobs that ran under the new limits and are still slow: from 3, halved again.
    later = now() + timedelta(minutes=10)
    set_clock(lambda: later)
    finished_jobs("slowpoke", [8.0] * 6, ago=30)
    rep = at.autotune().as_dict()
    item = {m["model"]: m for m in rep["models"]}["slowpoke"]
    assert item["old"]["max_concurrency"] == 3 and item["new"]["max_concurrency"] == 1
    assert item["inputs"]["samples"] == 6  # only jobs after the change
    assert len(log_rows()) == 3


def test_dry_run_writes_nothing(make_model, r):
    make_model("slowpoke", max_concurrency=6, expected_seconds=2)
    finished_jobs("slowpoke", [5.0] * 10)
    rep = at.autotune(dry_run=True).as_dict()
    item = rep["models"][0]
    assert item["action"] == "decrease" and item["new"]["max_concurrency"] == 3 and item["applied"] is False
    assert r.keys("asynch:runtime:*") == [] and log_rows() == []


def test_window_limits_the_samples(make_model):
    make_model("w", expected_seconds=100)
    finished_jobs("w", [1.0] * 10, ago=1000)
    assert at.autotune(window_seconds=600, dry_run=True).as_dict()["models"][0]["action"] == "skip"
    assert at.autotune(window_seconds=3600, dry_run=True).as_dict()["models"][0]["action"] == "hold"


def test_concurrent_runs_apply_one_decision(make_model, r):
    make_model("slowpoke", max_concurrency=8, expected_seconds=2)
    finished_jobs("slowpoke", [5.0] * 10)
    barrier, out = threading.Barrier(4), []

    def one():
        barrier.wait()
        out.extend(at.autotune().as_dict()["models"])

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One decision on this evidence, however the runs interleave (no 8 -> 4 -> 2 -> 1).
    assert r.get("asynch:runtime:max_concurrency:{slowpoke}") == "4"
    assert len(log_rows()) == 1
    assert sum(1 for item in out if item["changed"]) == 1


def test_seed_autotune_route_runs_over_the_database(client, admin_key, make_model, r):
    make_model("slowpoke", max_concurrency=6, expected_seconds=2)
    finished_jobs("slowpoke", [5.0] * 10)
    body = client.post("/model/autoTune", json={"windowSeconds": 3600}, headers=auth(admin_key)).get_json()
    assert body["code"] == 0 and body["data"]["models"][0]["applied"] is True
    assert r.get("asynch:runtime:max_concurrency:{slowpoke}") == "3"
