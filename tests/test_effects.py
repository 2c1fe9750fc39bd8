"""Effects follow from the transitions (issue 22 item 4): the after-commit
effects of a job's transition are run by app/jobs/effects.py alone, and every
won move out of pending/running is handed to it.  Source scans over app/ and
workers/ (like test_layers.py): a new caller that runs an effect by hand, or
forgets to hand a transition's result over, fails here."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EFFECTS = "app/jobs/effects.py"

# module alias -> the effect functions called through it.
EFFECT_CALLS = {("dispatch", "finished"), ("dispatch", "returned"), ("metrics", "job_finished"), ("effects", "run")}
# Tasks only the effects publish, by name.  (The outbox's doorbell is its
# pump token, which the outbox publishes too: retries, the sweep, replays.)
EFFECT_TASKS: set[str] = set()
# The transitions that return a transitions.Moved (their effects are due after the commit).
MOVES = {"complete", "complete_group", "fail_attempt", "cancel", "fail_by_admin", "time_out", "expire", "return_busy"}


def _sources():
    for top in ("app", "workers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path))


def _attr_call(node: ast.AST) -> tuple[str, str] | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
        return node.func.value.id, node.func.attr
    return None


def test_effect_functions_are_called_from_the_effects_module_only():
    offenders = []
    for rel, tree in _sources():
        if rel == EFFECTS:
            continue
        for node in ast.walk(tree):
            called = _attr_call(node)
            if called in EFFECT_CALLS:
                offenders.append(f"{rel}:{node.lineno} {called[0]}.{called[1]}()")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "publish_task":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Name) and first.id in EFFECT_TASKS:
                    offenders.append(f"{rel}:{node.lineno} publish_task({first.id})")
    assert offenders == [], "after-commit effects run outside app/jobs/effects.py:\n" + "\n".join(offenders)


def test_every_won_move_is_handed_to_the_effects():
    """Each call of a Moved-returning transition in app/ is the argument of
    ``due.add(...)`` or ``due.add_all(...)`` (app/jobs/effects.py ``collecting``), so its effects
    cannot be forgotten."""
    handed, bare = 0, []
    for rel, tree in _sources():
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            called = _attr_call(node)
            if called is None or called[0] != "transitions" or called[1] not in MOVES:
                continue
            parent = parents.get(node)
            if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr in ("add", "add_all"):
                handed += 1
            else:
                bare.append(f"{rel}:{node.lineno} transitions.{called[1]}()")
    assert bare == [], "transitions whose effects are not collected:\n" + "\n".join(bare)
    assert handed >= 6  # service (2), execution (3: with the claim-time expiry), recovery (the attempt loop)


def test_the_scan_sees_a_hand_run_effect(tmp_path):
    """The scan itself: a module that calls dispatch.finished is caught."""
    tree = ast.parse("from app.jobs import dispatch\n\ndef f(r):\n    dispatch.finished(r.m, [(r.t, r.id, None, None)])\n")
    assert any(_attr_call(n) in EFFECT_CALLS for n in ast.walk(tree))
