"""The Lua scripts on real Redis: admission, release, reconcile; and the
registry: every script is one .lua file that states its KEYS/ARGV, none is
left in Python."""
from __future__ import annotations

import fnmatch
import re
import time
import tomllib

import redis as redis_lib
from helpers import ROOT, gate_depth, gate_members, tenant_depth

from app.infra.redis import gate, scripts
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.tenancy.keys import Principal


def test_admit_is_idempotent_per_job_and_release_is_idempotent(settings, r):
    assert gate.gate_admit("m", "t", "j1", 1).admitted
    assert gate.gate_admit("m", "t", "j1", 1).admitted  # the same job again: no second slot
    d = gate.gate_admit("m", "t", "j2", 1)
    assert not d.admitted and d.limit == 1 and d.depth == 1 and d.refused_by == "model"
    assert gate.gate_release("m", "t", "j1") is True
    assert gate.gate_release("m", "t", "j1") is False
    assert gate_depth("m") == 0 and tenant_depth("m", "t") == 0


def test_negative_or_zero_limits_reject(settings, r):
    assert not gate.gate_admit("m", "t", "j", 0).admitted
    r.set("asynch:runtime:queue_limit:{m}", -1)
    assert not gate.gate_admit("m", "t", "j", 10).admitted
    r.set("asynch:runtime:queue_limit:{m}", "garbage")  # unreadable override: the cap applies
    assert gate.gate_admit("m", "t", "j", 10).admitted


def test_a_tenant_at_its_share_is_refused_and_others_are_admitted(settings, r):
    assert [gate.gate_admit("m", "a", f"a{i}", 10, 3).admitted for i in range(4)] == [True, True, True, False]
    d = gate.gate_admit("m", "a", "a9", 10, 3)
    assert d.refused_by == "tenant" and d.limit == 3 and d.depth == 3
    assert gate.gate_admit("m", "b", "b0", 10, 3).admitted  # another tenant still gets in
    r.set("asynch:runtime:tenant_queue_limit:{m}", 1)  # the runtime override lowers every share
    assert not gate.gate_admit("m", "b", "b1", 10, 3).admitted
    r.set("asynch:runtime:tenant_queue_limit:{m}", 50)  # ...but never raises it
    assert gate.gate_admit("m", "c", "c0", 10, 1).admitted and not gate.gate_admit("m", "c", "c1", 10, 1).admitted
    assert gate_depth("m") == 5 and tenant_depth("m", "a") == 3


def test_reconcile_adds_missing_and_drops_orphans_but_spares_young_slots(settings, r):
    r.zadd("asynch:gate:{m}", {"orphan-old": time.time() - 3600, "young": time.time()})
    added, removed = gate.gate_reconcile("m", ["db-1", "db-2"], grace_seconds=30)
    assert sorted(added) == ["db-1", "db-2"] and removed == ["orphan-old"]
    assert set(r.zrange("asynch:gate:{m}", 0, -1)) == {"db-1", "db-2", "young"}


def test_reconcile_gates_matches_the_database_after_a_wipe(make_model, r):
    make_model("m", queue_limit=10)
    p = Principal("t", "user", None)
    ids = {jobs.submit(p, "m", {}).row.id for _ in range(4)}
    jobs.cancel_job(p, ids.pop())
    r.flushdb()  # Redis loses everything
    r.zadd("asynch:gate:{deleted-model}", {"ghost": time.time() - 3600})
    rep = maintenance.reconcile_gates()
    assert rep.details["added"] == 3 and rep.details["removed"] == 1
    assert set(r.zrange("asynch:gate:{m}", 0, -1)) == ids
    assert set(r.zrange("asynch:tgate:{m}:t", 0, -1)) == ids  # the tenant's share too
    assert r.zcard("asynch:gate:{deleted-model}") == 0


LUA_DIR = ROOT / "app" / "infra" / "redis"


def _opening_comment(text: str) -> str:
    """The comment lines a file opens with, up to its first line of code."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--") or line.startswith("--@include"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_every_lua_file_is_registered_and_states_its_keys_and_argv():
    on_disk = {p.stem for p in ROOT.joinpath("app").rglob("*.lua")}
    assert on_disk == set(scripts.NAMES) | set(scripts.LIBRARIES)
    assert {p.parent for p in ROOT.joinpath("app").rglob("*.lua")} == {LUA_DIR}  # beside their modules
    for name in on_disk:
        head = _opening_comment((LUA_DIR / f"{name}.lua").read_text())
        module = name.split("_", 1)[0]
        assert (LUA_DIR / f"{module}.py").exists(), f"{name}.lua: no module {module}.py owns its keys"
        assert "KEYS" in head and "ARGV" in head, f"{name}.lua does not open with its KEYS/ARGV"
    # Every script is run by its module, every library is included by a script.
    py = {p.stem: p.read_text() for p in LUA_DIR.glob("*.py")}
    for name in scripts.NAMES:
        assert f'scripts.get("{name}"' in py[name.split("_", 1)[0]], f"{name}.lua is never run"
        assert "--@include" not in scripts.SOURCES[name] and "redis.call" in scripts.SOURCES[name]
    for lib in scripts.LIBRARIES:
        assert any(f"--@include {lib}.lua" in (LUA_DIR / f"{n}.lua").read_text() for n in scripts.NAMES)


def test_no_python_module_in_app_holds_a_lua_script():
    holders = [str(p.relative_to(ROOT)) for p in ROOT.joinpath("app").rglob("*.py")
               if re.search(r"redis\.p?call\(", p.read_text())]
    assert holders == []


def test_a_non_editable_install_ships_every_lua_file():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["package-data"]["app.infra.redis"]
    for p in LUA_DIR.glob("*.lua"):
        assert any(fnmatch.fnmatch(p.name, g) for g in globs), p.name


def test_a_script_is_registered_once_per_client(settings, r):
    assert scripts.get("leader_release") is scripts.get("leader_release")
    other = redis_lib.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        mine = scripts.get("leader_release", other)
        assert mine is not scripts.get("leader_release") and mine.registered_client is other
        assert mine(keys=["asynch:{beat}:leader"], args=["nobody"]) == 0
    finally:
        other.close()


def test_one_job_and_a_batch_item_are_decided_by_the_same_rule(settings, r):
    """A lone admission is a batch of one: the same answers (429 reasons,
    limits, depths) and the same slots as the same items in one batch."""
    items = [("a", "a0", 5), ("a", "a1", 5), ("a", "a2", 5), ("b", "b0", 5), ("a", "a0", 5), ("c", "c0", 5),
             ("d", "d0", 5)]
    for m in ("one", "many"):
        r.set(f"asynch:runtime:tenant_queue_limit:{{{m}}}", 2)  # caps every share at 2
    one = [gate.gate_admit("one", t, j, 3, cap) for t, j, cap in items]
    many = gate.gate_admit_many([("many", t, j, 3, cap) for t, j, cap in items])
    assert one == many
    assert [(d.admitted, d.refused_by) for d in one] == [
        (True, ""), (True, ""), (False, "tenant"), (True, ""), (True, ""), (True, ""), (False, "model")]
    # c0, a newcomer at the full queue of 3, takes the reserve above it (ceil(3 x 0.05) = 1); d0 finds it taken.
    assert gate_members("one") == gate_members("many") == {"a0", "a1", "b0", "c0"}
    assert tenant_depth("one", "a") == tenant_depth("many", "a") == 2
