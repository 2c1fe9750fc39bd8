"""The running dev stack's state file, ``.asynch/dev.json``, as every
``asynch`` command reads it (`asynch dev` writes it: app/cli/devstack.py).

It holds the stack's settings (URLs with passwords, the admin key, the
ports; mode 0600) while the stack serves.  A command run anywhere inside the
checkout finds the nearest one at or above its working directory whose
stack holds its lock: the server commands take its ``env`` (``load_dev_env``,
when ASYNCH_DATABASE_URL is unset), the client commands its API URL and
admin key (``dev_client``, when --url / ASYNCH_URL and --key /
ASYNCH_API_KEY leave them open).  Explicit settings always win.

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


def read_state(start: Path | None = None) -> dict | None:
    """The state (``api``, ``admin_key``, ``env``, ...) of the nearest
    .asynch/dev.json at or above ``start`` (the cwd) whose stack is running, or None."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        state = d / STATE_DIR / STATE_FILE
        if state.is_file() and locked(d / STATE_DIR / LOCK_FILE):
            try:
                return json.loads(state.read_text())
            except (OSError, ValueError):
                return None
    return None


def load_dev_env(environ=None) -> dict | None:
    """Put a running dev stack's settings into ``environ`` (os.environ) when
    ASYNCH_DATABASE_URL is unset; the variables already set stay.  Returns
    the state used, if any."""
    environ = os.environ if environ is None else environ
    if environ.get("ASYNCH_DATABASE_URL"):
        return None
    state = read_state()
    if not state or not isinstance(state.get("env"), dict):
        return None
    for name, value in state["env"].items():
        if not environ.get(name):
            environ[name] = value
    return state


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
