"""Redis Cluster: every Lua script touches the keys of one hash slot, and the
derived state (gates, tenant shares, permits, the dispatcher, runtime
overrides, rate limits, beat leadership, epoch marks) and the wake-ups work
on a local 3-master cluster -- in process, then with a real API server and
a real worker whose ASYNCH_REDIS_URL is the cluster (the broker stays the
single test Redis: docs/operations.md, "Redis topologies").

Redis 7 refuses a script that touches a key outside the slots of its
declared keys ("Script attempted to access keys that do not hash to the
same slot"), so running every script here is the check."""
from __future__ import annotations

import json

import pytest
import requests
from cluster.redis_cluster import LocalRedisCluster
from helpers import WorkerProcess, auth, gate_depth, make_key, permits, tenant_depth, wait_until

from app.config import set_settings
from app.infra.redis import dispatch as rd
from app.infra.redis import epoch, gate, keys, leader, ratelimit, runtime
from app.infra.redis.client import get_redis, is_cluster, pubsub_client, reset_redis

pytestmark = [pytest.mark.cluster]

MODELS = [f"m{i}" for i in range(8)]


@pytest.fixture(scope="module")
def rcluster(tmp_path_factory):
    c = LocalRedisCluster(tmp_path_factory.mktemp("rcluster")).start()
    yield c
    c.stop()


@pytest.fixture
def on_cluster(settings, rcluster):
    for p in rcluster.ports:
        rcluster.node(p).flushall()
    s = settings.with_overrides(redis_url=rcluster.url)
    set_settings(s)
    reset_redis()
    yield s
    set_settings(settings)
    reset_redis()


def _nodes_of_models(rcluster) -> dict[str, set[int]]:
    """model -> the ports of the nodes holding any of its keys."""
    where: dict[str, set[int]] = {}
    for port in rcluster.ports:
        for k in rcluster.node(port).scan_iter(count=1000):
            if "{" in k and "}" in k:
                tag = k[k.index("{") + 1:k.index("}", k.index("{"))]
                where.setdefault(tag, set()).add(port)
    return where


def test_every_script_runs_on_one_slot_and_each_models_keys_share_a_node(on_cluster, rcluster):
    assert is_cluster()
    # Gate (gate_admit.lua), reconcile (gate_reconcile.lua), the dispatcher
    # (dispatch_enqueue/pull/claimed/finish/kick.lua) with weights, runtime
    # overrides (runtime_limits_cas.lua).
    rd.set_weight("a", 3, MODELS)
    for m in MODELS:
        rd.set_cap(m, 2)
        for i, t in enumerate(("a", "a", "b")):
            assert gate.gate_admit(m, t, f"{m}-j{i}", cap=10, tenant_cap=2).admitted
        assert not gate.gate_admit(m, "a", f"{m}-j9", cap=10, tenant_cap=2).admitted  # a's share
        assert rd.enqueue(m, [(t, f"{m}-j{i}", float(i), 0, "") for i, t in enumerate(("a", "a", "b"))]).ring
        sent = rd.pull(m, 8, 30).pulled  # a worker's free slots
        assert {j for _, j, _ in sent} == {f"{m}-j0", f"{m}-j1", f"{m}-j2"}
        rd.claimed(m, [("a", f"{m}-j0")], 30)
        released, _ = rd.finish(m, [("a", f"{m}-j0", "", None, None)])
        assert released == [True] and permits(m, "a") == [f"{m}-j1"]
        rd.kick(m, broker_lost=True)
        assert gate.gate_reconcile(m, [f"{m}-j1", f"{m}-j2"], grace_seconds=0) == ([], [])
        assert runtime.runtime_limits_cas(m, (None, None), 1, 5, 60)
        assert runtime.runtime_limits_raw(m) == ("1", "5")
    # The operator reads' split of each gate (pipelines over every model's slot): pending + running = its slots.
    split, own = gate.slot_split(MODELS), gate.slot_split(MODELS, "a")
    assert all(sum(split[m]) == gate_depth(m) and sum(own[m]) == tenant_depth(m, "a") for m in MODELS)
    assert all(split[m][1] >= own[m][1] for m in MODELS)
    # The gate reads the runtime override: 2 slots held, a limit of 2 refuses a tenant holding one
    # (a newcomer's first job could still enter the fair share's reserve above it).
    m = MODELS[0]
    r = get_redis()
    r.set(keys.runtime_queue_limit(m), 2)
    assert gate.gate_admit(m, "a", "late", cap=10).refused_by == "model"
    r.delete(keys.runtime_queue_limit(m))
    assert gate.gate_admit(m, "a", "late", cap=10).admitted
    assert rd.weights() == {"a": 3} and r.hgetall(keys.dispatch_weights(m)) == {"a": "3"}
    assert sorted(gate.gate_models()) == MODELS and rd.models() == set(MODELS)

    # Single-key and {beat}-tagged scripts: rate limits, leadership, epochs.
    assert ratelimit.take("key-1", rate=1, burst=2).allowed
    assert ratelimit.take("key-1", rate=1, burst=2).allowed
    assert not ratelimit.take("key-1", rate=1, burst=2).allowed
    t1 = leader.leader_acquire("beat-a", 5)
    assert t1 > 0 and leader.leader_acquire("beat-b", 5) == 0 and leader.leader_current() == (t1, "beat-a")
    assert leader.leader_release("beat-a") and leader.leader_acquire("beat-b", 5) > t1
    marks = epoch.claim_epochs("tok")
    assert len([n for n in marks if n.startswith("redis")]) == 3  # one mark per master
    assert [n for n in epoch.claim_epochs("tok2") if n.startswith("redis")] == []

    where = _nodes_of_models(rcluster)
    for m in MODELS:
        assert len(where[m]) == 1, f"{m}'s keys are spread over {where[m]}"
    assert len({next(iter(where[m])) for m in MODELS}) >= 2, "the models should spread over the masters"

    # A master that loses its data alone is noticed: its mark is gone.
    victim = next(iter(where[MODELS[0]]))
    rcluster.node(victim).flushall()
    lost = [n for n in epoch.claim_epochs("tok3") if n.startswith("redis")]
    assert len(lost) == 1
    epoch.drop_epochs("tok3", lost)
    assert [n for n in epoch.claim_epochs("tok4") if n.startswith("redis")] == lost


def _wake_up_of(m: dict | None) -> str | None:
    """The job id a terminal wake-up message names (its snapshot's ``id``, or the bare id), None for none."""
    if not m or m.get("type") != "message":
        return None
    try:
        return json.loads(m["data"])["id"]
    except (ValueError, TypeError, KeyError):
        return str(m["data"])


def test_a_wake_up_published_on_one_master_reaches_a_listener_on_every_other(on_cluster, rcluster):
    where = {}
    for m in MODELS:
        gate.gate_admit(m, "t", f"{m}-x", cap=5)
    for tag, ports in _nodes_of_models(rcluster).items():
        where.setdefault(next(iter(ports)), tag)
    assert len(where) >= 2
    listeners = []
    for _ in rcluster.ports:  # pubsub_client takes the next master each time
        ps = pubsub_client("test-listener").pubsub()
        ps.subscribe(keys.terminal_channel())
        wait_until(lambda p=ps: (p.get_message(timeout=0.2) or {}).get("type") == "subscribe", timeout=5)
        listeners.append(ps)
    assert len({ps.connection.port for ps in listeners}) == len(rcluster.ports)
    for port, model in where.items():
        rd.finish(model, [("t", f"{model}-x", json.dumps({"id": f"{model}-x"}), None, None)])
        for ps in listeners:  # (other wake-ups on the channel -- a job id alone, another test's -- are passed over)
            wait_until(lambda p=ps, want=f"{model}-x": _wake_up_of(p.get_message(timeout=0.2)) == want, timeout=5,
                       what=f"the wake-up from node {port}")
    for ps in listeners:
        ps.close()


@pytest.mark.e2e
def test_api_and_worker_serve_jobs_with_their_derived_state_on_a_redis_cluster(on_cluster, rcluster, test_env,
                                                                               tmp_path, make_model):
    from api_process import ApiProcess

    env = {**test_env, "ASYNCH_REDIS_URL": rcluster.url}
    api = ApiProcess(test_env, tmp_path, extra_env={"ASYNCH_REDIS_URL": rcluster.url}).start()
    worker = WorkerProcess(env, concurrency=2, log_path=tmp_path / "worker.log", name="rcw").start()
    try:
        for name in ("echo", "other"):
            make_model(name, queue_limit=40, max_concurrency=2)
        keys_ = {t: make_key(t) for t in ("ta", "tb")}
        ids = []
        for i in range(24):
            t = "ta" if i % 2 else "tb"
            model = "echo" if i % 3 else "other"
            resp = requests.post(f"{api.base}/v1/models/{model}/jobs", json={"i": i, "sleep_ms": 20},
                                 headers=auth(keys_[t]), timeout=10)
            assert resp.status_code == 202, resp.text
            ids.append((model, t, resp.json()["job_id"]))
        for model, t, jid in ids:  # long-polls woken through the cluster's pub/sub
            resp = requests.get(f"{api.base}/v1/models/{model}/jobs/{jid}/wait", params={"timeout": 20000},
                                headers=auth(keys_[t]), timeout=30)
            assert resp.status_code == 200 and resp.json()["state"] == "done", resp.text
        r = get_redis()
        wait_until(lambda: all(r.zcard(keys.gate(m)) == 0 for m in ("echo", "other")), what="gates empty")
        assert all(permits(m, t) == [] for m in ("echo", "other") for t in ("ta", "tb"))
        # A runtime override on the cluster is what the API's gate reads.
        r.set(keys.runtime_queue_limit("echo"), 0)
        refused = requests.post(f"{api.base}/v1/models/echo/jobs", json={}, headers=auth(keys_["ta"]), timeout=10)
        assert refused.status_code == 429
        r.delete(keys.runtime_queue_limit("echo"))
        ok = requests.post(f"{api.base}/v1/models/echo/jobs", json={}, headers=auth(keys_["ta"]), timeout=10)
        assert ok.status_code == 202
        jid = ok.json()["job_id"]
        wait_until(lambda: requests.get(f"{api.base}/v1/models/echo/jobs/{jid}", headers=auth(keys_["ta"]),
                                        timeout=5).json()["state"] == "done", what="the last job")
        assert requests.get(f"{api.base}/readyz", timeout=5).status_code == 200
    finally:
        worker.stop()
        api.stop()
