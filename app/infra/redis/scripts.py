"""The registry of our Lua scripts, each a ``<module>_<name>.lua`` file in this package beside the module that
owns its keys, run through ``get(name)``.

Invariants:
- Each script is written once, in its file, which opens with a comment stating its KEYS and ARGV
  (tests/test_redis_scripts.py checks both, and that no Python module in app/ holds Lua).
- All of ``NAMES`` are read at import: a missing file (a broken install; pyproject.toml ships them as package
  data) fails at start.
- A line ``--@include <file>.lua`` is replaced by that file's text (the dispatch steps share dispatch_lib.lua,
  the upstream controller's upstream_lib.lua); one level: an included file includes nothing.
- Scripts run by EVALSHA, loaded on NOSCRIPT (redis-py's ``Script``); under Redis Cluster each touches the
  keys of one slot (keys.py), routed by them.
- A script is registered once per client, its ``Script`` kept on the client itself: it dies with it
  (reset_redis, fork) and never outlives it.
"""
from __future__ import annotations

import re
from importlib import resources

import redis

from app.infra.redis.client import get_redis

NAMES = ("gate_admit", "gate_reconcile", "dispatch_enqueue", "dispatch_pull", "dispatch_express", "dispatch_claimed",
         "dispatch_finish", "dispatch_kick",
         "dispatch_return", "dispatch_position", "dispatch_waiting", "upstream_budget", "epoch_compare_delete", "leader_acquire", "leader_release",
         "ratelimit_token_bucket", "runtime_limits_cas")
# Files only ever included by others, never run alone.
LIBRARIES = ("dispatch_lib", "upstream_lib")

_INCLUDE = re.compile(r"^--@include ([a-z_]+)\.lua$", re.M)
_ATTR = "_asynch_scripts"


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def _load(name: str) -> str:
    def include(m: re.Match) -> str:
        lib = _read(m.group(1))
        if _INCLUDE.search(lib):
            raise ValueError(f"{m.group(1)}.lua: an included file includes nothing")
        return lib.rstrip("\n")
    return _INCLUDE.sub(include, _read(name))


SOURCES: dict[str, str] = {name: _load(name) for name in NAMES}


def get(name: str, client: redis.Redis | None = None):
    """Script ``name`` registered once on ``client`` (default: the gate's): ``get(name)(keys=, args=, client=)``."""
    r = client if client is not None else get_redis()
    cache = r.__dict__.setdefault(_ATTR, {})
    if name not in cache:
        cache[name] = r.register_script(SOURCES[name])
    return cache[name]
