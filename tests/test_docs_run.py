"""The docs run as printed (issue 23 item 2): every shell and Python block of
README.md, docs/client.md, docs/api.md and docs/migrating.md runs, in order,
against one live `asynch dev` stack started here on free ports, with only the ports and the
key substituted (``127.0.0.1:8000`` / ``localhost:8000`` -> the API's port,
``127.0.0.1:8765`` -> the demo model's, ``ak_...`` -> the stack's admin key).

A block that must not run is marked by an HTML comment ``<!-- no-run: why
-->`` on the line before its fence.  A document's blocks share one
environment, as a reader's terminal does: each shell block runs in
``bash -euo pipefail`` with every assignment exported, and what it exported
is there for the next block (a Python block too).  ``curl`` fails on an HTTP
error answer (``--fail-with-body``), so a 422 fails its block as it would
fail the reader.  The blocks run in a directory whose ``.asynch`` is the
stack's data directory -- as inside a checkout where `./scripts/dev.sh`
runs -- with ``.venv/bin`` on PATH (``. .venv/bin/activate``), so ``asynch``
finds the stack by itself.

Also: `asynch wait <job id>` with no flags against that stack (on a
non-default port), and the dev receiver's verified webhook of the README's
webhook line.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests
from helpers import ROOT, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DOCS = ("README.md", "docs/client.md", "docs/api.md", "docs/migrating.md")
RUNNABLE = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "py": "python"}
FENCE = re.compile(r"^```(\S*)")
NO_RUN = re.compile(r"^<!--\s*no-run\b")
FORGED = "wh_forged"


def blocks(doc: str) -> list[dict]:
    """The fenced blocks of a markdown file: language, text, line, and whether marked no-run."""
    out, lines, i = [], (ROOT / doc).read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, prev = i, next((x for x in reversed(lines[:i]) if x.strip()), "")
        i += 1
        while not lines[i].startswith("```"):
            i += 1
        out.append({"lang": m.group(1), "text": "\n".join(lines[start + 1:i]) + "\n", "line": start + 1,
                    "no_run": bool(NO_RUN.match(prev.strip()))})
        i += 1
    return out


@pytest.fixture(scope="module")
def stack():
    base = Path(tempfile.mkdtemp(prefix="asynch-docs-"))  # not pytest's 0700 tree: under root PostgreSQL reaches it
    os.chmod(base, 0o755)
    (base / ".venv").symlink_to(ROOT / ".venv")
    port, model_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCH_", "PROMETHEUS_"))}
    env.update(PYTHONPATH=str(ROOT), ASYNCH_LOG_LEVEL="WARNING", PATH=f"{ROOT / '.venv' / 'bin'}:{env['PATH']}")
    log = open(base / "dev.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "dev", "--port", str(port), "--model-port",
                             str(model_port), "--data-dir", str(base / ".asynch")], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    state_file = base / ".asynch" / "dev.json"

    def up():
        assert proc.poll() is None, (base / "dev.log").read_text()[-3000:]
        return state_file.exists()

    try:
        wait_until(up, timeout=180, interval=0.3, what="asynch dev")
        state = json.loads(state_file.read_text())
        yield {"dir": base, "env": env, "port": port, "model_port": model_port, "key": state["admin_key"],
               "api": state["api"], "demo": state["demo_model"]}
    finally:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)


def substitute(text: str, s: dict) -> str:
    for host in ("127.0.0.1", "localhost"):
        text = text.replace(f"{host}:8000", f"127.0.0.1:{s['port']}").replace(f"{host}:8765",
                                                                             f"127.0.0.1:{s['model_port']}")
    return text.replace("ak_...", s["key"])


# A reader's curl shows an error answer; the test's fails its block on one.
_SHELL = """set -a
curl() { command curl --fail-with-body --max-time 60 "$@"; }
%s
env -0 > "$DOCS_ENV_OUT"
"""


def run_block(b: dict, env: dict, s: dict, doc: str) -> dict:
    """Run one block in ``env``; returns the environment after it (a shell block's exports)."""
    text, where = substitute(b["text"], s), f"{doc}:{b['line']}"
    out_file = s["dir"] / "env.out"
    if RUNNABLE[b["lang"]] == "sh":
        argv = ["bash", "-euo", "pipefail", "-c", _SHELL % text]
    else:
        argv = [sys.executable, "-c", text]
    got = subprocess.run(argv, cwd=s["dir"], env={**env, "DOCS_ENV_OUT": str(out_file)}, capture_output=True,
                         text=True, timeout=180)
    assert got.returncode == 0, f"{where} exited {got.returncode}\n{text}\nstdout:\n{got.stdout[-3000:]}\n" \
                                f"stderr:\n{got.stderr[-3000:]}"
    assert "Traceback" not in got.stderr, f"{where}:\n{got.stderr[-3000:]}"
    if RUNNABLE[b["lang"]] != "sh":
        return env
    pairs = (x.split("=", 1) for x in out_file.read_text().split("\0") if "=" in x)
    return {k: v for k, v in pairs if k not in ("DOCS_ENV_OUT", "_", "SHLVL", "OLDPWD", "PWD")}


@pytest.mark.parametrize("doc", DOCS)
def test_every_block_of_the_doc_runs_against_a_dev_stack(stack, doc):
    env, ran, skipped = dict(stack["env"]), [], []
    for b in blocks(doc):
        if b["lang"] not in RUNNABLE:
            # A command in a fence without a language would be skipped silently: name it sh (or mark it no-run).
            assert b["no_run"] or not re.match(r"\s*(\$ )?(curl|asynch|python3?|export) ", b["text"]), \
                f"{doc}:{b['line']}: a command block needs a language (```sh) or <!-- no-run -->"
            continue
        if b["no_run"]:
            skipped.append(b["line"])
            continue
        env = run_block(b, env, stack, doc)
        ran.append(b["line"])
    print(f"{doc}: ran {len(ran)} blocks (lines {ran}); {len(skipped)} marked no-run (lines {skipped})")
    assert ran, f"{doc}: no block ran"
    assert len(skipped) <= 3, f"{doc}: {len(skipped)} blocks marked no-run (lines {skipped}): run them"
    if doc == "README.md":
        # The README's webhook line reached the dev receiver, signed (it verifies every delivery).
        def webhooks():
            got = requests.get(f"{stack['demo']}/webhooks", timeout=10).json()["received"]
            got = [w for w in got if w["webhook_id"] != FORGED]
            return [w for w in got if w["type"] == "job.done"] and got
        received = wait_until(webhooks, timeout=60, what="the README's webhook at the dev receiver")
        assert all(w["verified"] for w in received), received


def test_asynch_wait_a_job_id_with_no_flags_on_a_non_default_port(stack):
    assert stack["port"] != 8000

    def asynch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["asynch", *args], cwd=stack["dir"], env=stack["env"], capture_output=True, text=True,
                              timeout=120)

    job = asynch("submit", "demo-echo", '{"prompt": "no flags"}', "-q")
    assert job.returncode == 0 and job.stdout.strip().startswith("job_"), job
    job_id = job.stdout.strip()
    out = asynch("wait", job_id)
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "done", out
    out = asynch("result", job_id)
    assert out.returncode == 0 and json.loads(out.stdout)["echo"] == {"prompt": "no flags"}, out
    # A subdirectory finds the stack too; the old MODEL JOB_ID form still works.
    (stack["dir"] / "sub").mkdir(exist_ok=True)
    out = subprocess.run(["asynch", "wait", "demo-echo", job_id], cwd=stack["dir"] / "sub", env=stack["env"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)["job_id"] == job_id, out
    # An unknown id: one line, the cause and the next step, no traceback.
    out = asynch("cancel", "job_nope")
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "Error: job not found: job_nope (HTTP 404): check the model name and the job id (GET /v1/models, "
        "GET /v1/jobs)"], out.stderr


def test_the_dev_receiver_refuses_a_delivery_it_cannot_verify(stack):
    body = json.dumps({"type": "job.done", "data": {"job_id": "job_forged"}})
    resp = requests.post(f"{stack['demo']}/webhooks", data=body, timeout=10, headers={
        "webhook-id": FORGED, "webhook-timestamp": str(int(time.time())),
        "webhook-signature": "v1,AAAA"})
    assert resp.status_code == 401 and resp.json()["error"] == "no signature matches", resp.text
    got = requests.get(f"{stack['demo']}/webhooks", timeout=10).json()["received"]
    assert got[0]["webhook_id"] == FORGED and got[0]["verified"] is False
