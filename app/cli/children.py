"""The processes `asynch dev` starts (its servers and its app processes), and
stopping them whatever signals arrive meanwhile.

Why not ``Popen.poll()`` / ``Popen.wait()``: they take ``Popen._waitpid_lock``;
an exception raised by a signal handler between that lock's acquire and its
``try`` leaves it held, and every later ``wait()`` blocks for ever.  That is
how a SIGTERM once left `asynch dev` hanging in its stop, with PostgreSQL and
Valkey still running (issue 32).

Invariants:
- Signals never raise: ``Signals`` turns SIGINT, SIGTERM and SIGHUP into a
  count that the code reads at points of its own choosing (``check()``,
  ``requested``); no handler takes a lock (Event.set() from a handler can
  deadlock against the thread it interrupts).
- Reaping is ``os.waitpid(pid, WNOHANG)`` on the pid, never through Popen's
  lock; a pid reaped already (ChildProcessError) counts as exited, as Popen
  itself counts it.
- Every wait is bounded: the polite signal, a grace period (cut short by
  ``hurry``: another signal during the stop), SIGKILL to the process group,
  then a short bounded wait; nothing here waits for ever.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Callable, Iterable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# After SIGKILL: how long to wait for the kernel to let a process go (one in
# uninterruptible sleep on a dead disk may take longer; we stop waiting then).
KILL_WAIT_SECONDS = 5.0
_TICK = 0.05


class Interrupted(Exception):
    """Raised by ``Signals.check()``: a stop was asked for (at a point of our choosing)."""


class Signals:
    """SIGINT, SIGTERM and SIGHUP counted, never raised (install() once, in the main thread)."""

    def __init__(self) -> None:
        self.count = 0

    def install(self) -> "Signals":
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    @staticmethod
    def ignore() -> None:
        """From now on (the stop is done) these signals do nothing: at exit
        Python puts a handled signal back to its default action, and a late
        SIGTERM or SIGHUP would then turn a clean stop into a killed process."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def _handle(self, _signum, _frame) -> None:
        self.count += 1  # an int store: no lock, nothing to leave half-done

    @property
    def requested(self) -> bool:
        return self.count > 0

    def check(self) -> None:
        if self.count:
            raise Interrupted()

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, ending early when a stop is asked for."""
        end = time.monotonic() + seconds
        while not self.count and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, _TICK * 4))

    def since(self) -> Callable[[], bool]:
        """True once a signal arrives after this call (during a stop: hurry)."""
        seen = self.count
        return lambda: self.count > seen


def returncode(proc: subprocess.Popen) -> int | None:
    """``proc``'s exit status once it has exited (reaping it), else None;
    never blocks and never takes Popen's lock."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:  # reaped already (by an interrupted Popen call): Popen says 0 then too
        proc.returncode = 0
        return 0
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode


def _signal(proc: subprocess.Popen, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)


def _wait(procs: list[subprocess.Popen], seconds: float, hurry: Callable[[], bool]) -> None:
    end = time.monotonic() + seconds
    while any(returncode(p) is None for p in procs) and time.monotonic() < end and not hurry():
        time.sleep(_TICK)


def stop(procs: Iterable[subprocess.Popen | None], sig: int = signal.SIGTERM, grace: float = 15,
         signal_group: bool = True, hurry: Callable[[], bool] = lambda: False) -> list[subprocess.Popen]:
    """Stop ``procs`` (each leads its own process group): ``sig`` to each still
    running (to its whole group with ``signal_group``, else to it alone), up to
    ``grace`` seconds for them to exit (less once ``hurry()``), then SIGKILL to
    every group -- whatever is left of it, a pool process mid-call or one that
    ignored ``sig`` -- and up to KILL_WAIT_SECONDS more.  Returns the processes
    that still had not exited (none, unless the kernel holds one)."""
    procs = [p for p in procs if p is not None]
    for p in procs:
        if returncode(p) is None:
            _signal(p, sig, signal_group)
    _wait(procs, grace, hurry)
    for p in procs:
        # Even a leader that exited: its group may still hold children.
        _signal(p, signal.SIGKILL, True)
    _wait(procs, KILL_WAIT_SECONDS, lambda: False)
    return [p for p in procs if returncode(p) is None]
