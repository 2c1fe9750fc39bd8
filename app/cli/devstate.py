"""The running dev stack's state file, ``.asynch/dev.json`` (`asynch dev`
writes it, mode 0600, while the stack serves: app/cli/devstack.py), as every
``asynch`` command inside the checkout reads it: the nearest one at or above
its working directory whose stack holds its lock.  Explicit settings win.

Invariants: reading never creates or changes a file (the lock is opened
read-only); a file left by a killed stack is ignored (its lock is free).
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

STATE_DIR = ".asynch"
STATE_FILE = "dev.json"
LOCK_FILE = "dev.lock"


def read_state() -> dict | None:
    """The state (``api``, ``admin_key``, ``env``, ...) of the nearest
    .asynch/dev.json at or above the cwd whose stack is running, or None."""
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        state = d / STATE_DIR / STATE_FILE
        if state.is_file() and locked(d / STATE_DIR / LOCK_FILE):
            try:
                return json.loads(state.read_text())
            except (OSError, ValueError):
                return None
    return None


def load_dev_env() -> None:
    """A running dev stack's settings (its ``env``) into os.environ for the
    server commands, when ASYNCH_DATABASE_URL is unset; variables already set stay."""
    state = None if os.environ.get("ASYNCH_DATABASE_URL") else read_state()
    if state and isinstance(state.get("env"), dict):
        for name, value in state["env"].items():
            if not os.environ.get(name):
                os.environ[name] = value


def dev_client(url: str | None, key: str | None) -> tuple[str | None, str | None]:
    """The API URL and key a client command uses: the given ones, else the
    running dev stack's (its admin key only for its own URL)."""
    if url and key:
        return url, key
    state = read_state() or {}
    url = url or state.get("api")
    if not key and url and url.rstrip("/") == str(state.get("api", "")).rstrip("/"):
        key = state.get("admin_key")
    return url, key


def locked(lock: Path) -> bool:
    """Does a running `asynch dev` hold this lock file?  (Opened read-only: nothing is created.)"""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
