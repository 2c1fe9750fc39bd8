"""Shared pieces of the stress and fault-injection tests: a background
maintenance loop (what beat does, faster) and the end-of-run invariant check."""
from __future__ import annotations

import threading
from contextlib import contextmanager

from sqlalchemy import select

from app.infra.db import transaction
from app.infra.tables import tasks
from app.states import SLOT_STATES, TERMINAL_STATES, JobState


@contextmanager
def maintenance_loop(interval: float = 0.3, republish_after: float | None = None, reconcile: bool = False):
    """Run retry/recovery passes in a thread for the duration of the block."""
    from app.maintenance import passes as maintenance

    stop = threading.Event()
    errors: list[BaseException] = []

    def loop():
        while not stop.is_set():
            try:
                maintenance.retry_due()
                maintenance.recover_expired_leases()
                if republish_after is not None:
                    maintenance.republish_stale_pending(older_than_seconds=republish_after)
                if reconcile:
                    maintenance.reconcile_gates()
            except Exception as exc:  # a pass may meet a Redis being flushed; the next one repairs
                errors.append(exc)
            stop.wait(interval)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield errors
    finally:
        stop.set()
        t.join(10)


def rows_for(ids) -> dict:
    with transaction() as conn:
        return {r.id: r for r in conn.execute(select(tasks).where(tasks.c.id.in_(list(ids))))}


def all_rows() -> dict:
    with transaction() as conn:
        return {r.id: r for r in conn.execute(select(tasks))}


def assert_ledger_invariants(admitted: list[str], r, models: list[str]) -> dict:
    """After a run: ids unique, a row for every 202 and a 202 for every row,
    every job terminal with finished_at, every gate empty."""
    assert len(admitted) == len(set(admitted)), "duplicate job ids in 202 answers"
    rows = all_rows()
    assert set(rows) == set(admitted), "rows and 202 answers differ"
    for row in rows.values():
        assert JobState(row.state) in TERMINAL_STATES, (row.id, row.state)
        assert row.finished_at is not None
        if JobState(row.state) in (JobState.DONE, JobState.CLAIMED):
            assert row.result_location and row.error is None
    for m in models:
        assert r.zcard(f"asynch:gate:{{{m}}}") == 0, f"gate {m} not empty"
    active = [x for x in rows.values() if JobState(x.state) in SLOT_STATES]
    assert active == []
    return rows


def model_payloads(model_server) -> list[dict]:
    """The payloads the stub model received, in arrival order."""
    with model_server.state.lock:
        return [c["payload"] for c in model_server.state.calls]


def called_with(model_server, key: str, value) -> bool:
    """Has the stub model received a call whose payload has key == value?"""
    return any(p.get(key) == value for p in model_payloads(model_server))
