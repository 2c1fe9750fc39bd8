"""Beat with many instances: the leader lock in-process (acquire, renew,
fencing, takeover), then two real ``celery beat`` processes and a worker:
each periodic task fires once per interval in total, the standby sends
nothing until the leader dies, then takes over in step."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from helpers import ROOT, WorkerProcess, wait_until

from app.infra.redis import leader
from app.maintenance import periodic


def test_one_leader_renews_and_a_standby_takes_over_with_a_larger_token(settings, r):
    a = periodic.Leadership(owner="beat-a", ttl_seconds=0.6)
    b = periodic.Leadership(owner="beat-b", ttl_seconds=0.6)
    ta = a.refresh(force=True)
    assert ta > 0 and b.refresh(force=True) == 0
    assert a.refresh(force=True) == ta  # renewal keeps the token
    fence_a = a.fence()
    assert periodic.fence_holds(fence_a)
    # a stops renewing (paused, dead): after the TTL b leads with a larger token.
    tb = wait_until(lambda: b.refresh(force=True), timeout=5, interval=0.05, what="b takes over")
    assert tb > ta
    assert a.refresh(force=True) == 0  # a notices on its next renewal
    # Work a stamped before losing the lock is refused; b's runs.
    ran = []
    assert periodic.run_periodic("t", fence_a, lambda: ran.append("a") or {"processed": 0}) == {"skipped": "fenced"}
    assert periodic.run_periodic("t", b.fence(), lambda: ran.append("b") or {"processed": 0})["processed"] == 0
    assert ran == ["b"]
    # A clean shutdown hands over at once.
    b.release()
    assert a.refresh(force=True) > tb
    runs = periodic.recent_runs()
    assert [(x["task"], x["owner"]) for x in runs] == [("t", "beat-b")]


def test_a_routine_pass_logs_one_info_line_only_when_it_did_something(settings, r, caplog):
    """Beat's passes run every few seconds: celery's own lines for them are
    DEBUG (app/infra/logs.py quiet_routine_tasks; the whole stack's log is
    tests/test_dev_lifecycle.py's), and the pass says one INFO line only when
    it did something (issue 32, item 7)."""
    import logging

    from app.infra.logs import quiet_routine_tasks

    caplog.set_level(logging.INFO)
    periodic.run_periodic("run_work", None, lambda: {"processed": 0})
    periodic.run_periodic("recover", None, lambda: {"processed": 2, "leases": {"processed": 2}})
    lines = [(x.levelno, x.getMessage()) for x in caplog.records if x.name == "app.maintenance.periodic"]
    assert lines == [(logging.INFO, 'periodic recover: {"processed": 2, "leases": {"processed": 2}}')]
    # Celery's "received" / "succeeded" lines (its fields as extra["data"]) of the passes: gone at INFO;
    # another task's, and a pass's failure, stay.
    quiet_routine_tasks({"asynch.run_work"})
    caplog.clear()
    for logger, level, name in (("celery.worker.strategy", logging.INFO, "asynch.run_work"),
                                ("celery.app.trace", logging.INFO, "asynch.run_work"),
                                ("celery.app.trace", logging.INFO, "asynch.run_jobs"),
                                ("celery.app.trace", logging.ERROR, "asynch.run_work")):
        logging.getLogger(logger).log(level, "Task %(name)s", {"name": name}, extra={"data": {"name": name}})
    assert [(x.name, x.levelno, x.getMessage()) for x in caplog.records if x.name.startswith("celery")] == [
        ("celery.app.trace", logging.INFO, "Task asynch.run_jobs"),
        ("celery.app.trace", logging.ERROR, "Task asynch.run_work")]


def _beat(env: dict, schedule: str, log) -> subprocess.Popen:
    from app.cli.processes import beat_argv

    return subprocess.Popen(beat_argv(schedule), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _leader_pid() -> int | None:
    cur = leader.leader_current()
    return int(cur[1].split(":")[1]) if cur else None


@pytest.mark.slow
@pytest.mark.e2e
def test_two_beats_fire_each_task_once_per_interval_and_the_standby_takes_over(test_env, tmp_path, r):
    every = {"run_work": 2.0, "recover": 2.0, "cleanup": 3.0, "autotune": 3.0}
    env = {**os.environ, **test_env,
           "ASYNCH_BEAT_RETRY_SECONDS": "2", "ASYNCH_BEAT_RECOVER_SECONDS": "2",
           "ASYNCH_BEAT_CLEANUP_SECONDS": "3", "ASYNCH_BEAT_AUTOTUNE_SECONDS": "3",
           "ASYNCH_BEAT_LOCK_TTL_SECONDS": "3"}
    worker = WorkerProcess(env, concurrency=2, log_path=tmp_path / "worker.log", name="beatw").start()
    logs = [open(tmp_path / f"beat-{i}.log", "w") for i in range(2)]
    beats = []
    try:
        beats.append(_beat(env, str(tmp_path / "a.schedule"), logs[0]))
        wait_until(lambda: _leader_pid() == beats[0].pid, timeout=30, what="beat a leads")
        beats.append(_beat(env, str(tmp_path / "b.schedule"), logs[1]))
        time.sleep(12)  # both beats run side by side: the span under test
        killed_at = time.time()
        os.killpg(beats[0].pid, signal.SIGKILL)
        beats[0].wait(10)
        wait_until(lambda: _leader_pid() == beats[1].pid, timeout=15, what="beat b takes over")
        time.sleep(10)
    finally:
        for p in beats:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(15)
        worker.stop()
        for f in logs:
            f.close()

    runs = periodic.recent_runs(1000)
    owners = {x["owner"] for x in runs}
    pid_of = {o: int(o.split(":")[1]) for o in owners}
    assert set(pid_of.values()) == {beats[0].pid, beats[1].pid}, owners
    for task, interval in every.items():
        mine = sorted((x for x in runs if x["task"] == task), key=lambda x: x["sent_at"])
        sent = [x["sent_at"] for x in mine]
        gaps = [b - a for a, b in zip(sent, sent[1:])]
        # Never two runs in one interval, whichever beat sent them...
        assert min(gaps) >= 0.6 * interval, (task, gaps)
        # ...and no interval skipped (1.5 s of slack for a loaded machine), except
        # across the takeover: the leader's last send, the lock TTL (3 s) and a
        # renewal tick (1 s) to notice, then the standby's next due time.
        steady = [g for a, g in zip(sent, gaps) if not a < killed_at < a + g]
        assert max(steady) <= interval + 1.5, (task, gaps)
        assert max(gaps) <= 2 * interval + 3 + 1 + 1.5, (task, gaps)
        # The standby sent nothing while the leader lived; then only it did.
        by = [pid_of[x["owner"]] for x in mine]
        before = [p for x, p in zip(mine, by) if x["sent_at"] < killed_at]
        after = [p for x, p in zip(mine, by) if x["sent_at"] > killed_at]
        assert set(before) == {beats[0].pid} and set(after) == {beats[1].pid}, (task, by)
        assert len(before) >= 12 / interval - 1 and len(after) >= 5 / interval - 1, (task, len(before), len(after))
        tokens = {pid_of[x["owner"]]: x["token"] for x in mine}
        assert tokens[beats[1].pid] > tokens[beats[0].pid]
