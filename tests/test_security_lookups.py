"""Issue 21 items 4 and 9 (ports): callback and webhook URL checks.

Item 4: four slow DNS names of one tenant filled the 4-thread resolver pool
and every other tenant's check, even of an IP literal, then failed "did not
resolve within".  Now literals never reach DNS, a lookup holds nothing past
its deadline, a tenant has a cap on lookups in flight, and a batch looks
each host up once, at most ASYNCH_BATCH_MAX_URL_HOSTS names.  A DNS server
on 127.0.0.1 (tests/dns_stub.py) stands in for a slow one; the system
resolver (``socket.getaddrinfo``, which the old code used) is made as slow
for the same names, so each test fails on the old code for its real reason.

Item 9: callback/webhook URLs take ports 80, 443 and 1024-65535 only (any
port for an allowlisted host), and ``:0`` is a 422, on every face.
Real PostgreSQL and Redis, the API in process (Flask test client)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from helpers import auth, wait_until
from dns_stub import DnsStub

from app.config import set_settings
from app.infra.http import netguard

ROOT = Path(__file__).resolve().parent.parent
SLOW = [f"slow{i}.b.test" for i in range(6)]


@pytest.fixture
def dns(settings, monkeypatch):
    """The stub as the nameserver, and the system resolver as slow as the
    stub for the hanging names (released at the end of the test)."""
    stub = DnsStub(hang=["b.test"])
    release = threading.Event()
    real = socket.getaddrinfo

    def system_resolver(host, port, family=0, type=0, proto=0, flags=0):
        name = str(host).rstrip(".")
        if name.endswith(".test"):
            stub.note(name, "getaddrinfo")
            if name.endswith("b.test"):
                release.wait(30)
                raise socket.gaierror(socket.EAI_AGAIN, "timed out")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port or 0))]
        return real(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)  # no traffic off the box

    monkeypatch.setattr(socket, "getaddrinfo", system_resolver)
    set_settings(settings.with_overrides(resolve_nameservers=stub.address, resolve_timeout_seconds=3.0,
                                         resolve_tenant_inflight=4, callback_allow_hosts=""))
    yield stub
    release.set()
    stub.stop()


def _check_in_background(url: str, tenant: str, out: list) -> threading.Thread:
    def run():
        try:
            netguard.check_url(url, netguard.Lookups(tenant))
            out.append(None)
        except netguard.UrlRefused as exc:
            out.append(str(exc))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _submit_in_background(app, key: str, url: str, out: list) -> threading.Thread:
    def run():
        r = app.test_client().post("/v1/models/m/jobs", json={}, headers={**auth(key), "X-Callback-Url": url})
        out.append((r.status_code, r.get_data(as_text=True)))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_another_tenants_slow_names_block_neither_literals_nor_other_names(client, make_model, user_key,
                                                                          other_key, dns):
    make_model("m", queue_limit=100)
    b_results: list = []
    threads = [_submit_in_background(client.application, other_key, f"http://{name}/cb", b_results)
               for name in SLOW]
    # B's lookups are hanging at the nameserver (on the old code: in the resolver pool).
    wait_until(lambda: sum(dns.count(n) for n in SLOW) >= 4, timeout=10, what="tenant B's lookups in flight")
    # Tenant A's IP literal: classified without any lookup.
    r = client.post("/v1/models/m/jobs", json={}, headers={**auth(user_key), "X-Callback-Url": "http://1.1.1.1/cb"})
    assert r.status_code == 202, r.get_json()
    assert dns.count("1.1.1.1") == 0
    # Tenant A's name: looked up at once, not behind B's.
    r = client.post("/v1/models/m/jobs", json={},
                    headers={**auth(user_key), "X-Callback-Url": "http://hooks.a.test:8443/cb"})
    assert r.status_code == 202, r.get_json()
    for t in threads:
        t.join(timeout=20)
    # B's own submits are 422s (the host did not resolve in time), and B gave back every place.
    assert len(b_results) == len(SLOW) and all(st == 422 and "did not resolve" in text for st, text in b_results)
    assert netguard.resolver.in_flight.held["tenant-b"] == 0


def test_a_tenant_has_at_most_its_cap_of_lookups_in_flight(dns, settings):
    set_settings(settings.with_overrides(resolve_nameservers=dns.address, resolve_timeout_seconds=3.0,
                                         resolve_tenant_inflight=2))
    results: list = []
    seen: list[int] = []
    threads = [_check_in_background(f"http://{name}/cb", "tenant-b", results) for name in SLOW]
    while any(t.is_alive() for t in threads):
        seen.append(netguard.resolver.in_flight.held["tenant-b"])
        threads[0].join(timeout=0.01)
    for t in threads:
        t.join(timeout=20)
    assert max(seen) == 2  # never more than the cap, though six were asked for at once
    assert len(results) == len(SLOW) and all(r and "did not resolve" in r for r in results), results
    assert netguard.resolver.in_flight.held["tenant-b"] == 0


def test_a_batch_looks_each_host_up_once_and_caps_the_names(client, make_model, user_key, dns, settings):
    set_settings(settings.with_overrides(resolve_nameservers=dns.address, resolve_cache_seconds=0,
                                         batch_max_url_hosts=3, callback_allow_hosts=""))
    make_model("m", queue_limit=2000, max_concurrency=1)
    items = [{"payload": {"i": i}, "callback_url": "http://same.a.test:8080/cb"} for i in range(1000)]
    resp = client.post("/v1/models/m/jobs:batch", json={"jobs": items}, headers=auth(user_key))
    assert resp.status_code == 207, resp.get_json()
    assert {r["status"] for r in resp.get_json()["results"]} == {202}
    # One lookup (A and AAAA) for the 1,000 items, not 1,000 (the cache is off).
    assert dns.count("same.a.test") <= 2, dns.asked

    items = [{"payload": {"i": i}, "callback_url": f"http://h{i}.a.test/cb"} for i in range(5)]
    items += [{"payload": {"i": 9}, "callback_url": "http://93.184.216.35/cb"},   # literals do not count
              {"payload": {"i": 10}, "webhook_url": "http://h0.a.test/w"}]       # a name already seen
    res = client.post("/v1/models/m/jobs:batch", json={"jobs": items}, headers=auth(user_key)).get_json()["results"]
    assert [r["status"] for r in res] == [202, 202, 202, 422, 422, 202, 202], res
    assert res[3]["errors"][0]["pointer"] == "/jobs/3/callback_url"
    assert "at most 3 distinct callback/webhook host names" in res[3]["errors"][0]["message"]
    assert dns.count("h3.a.test") == 0 and dns.count("h4.a.test") == 0  # refused, not looked up


def test_answers_are_cached_for_a_short_while(dns, settings):
    set_settings(settings.with_overrides(resolve_nameservers=dns.address, resolve_cache_seconds=60))
    for _ in range(3):
        netguard.check_url("http://cached.a.test/cb", netguard.Lookups("tenant-a"))
    assert dns.count("cached.a.test") <= 2  # A and AAAA once
    set_settings(settings.with_overrides(resolve_nameservers=dns.address, resolve_cache_seconds=0))
    netguard.check_url("http://cached.a.test/cb")
    assert dns.count("cached.a.test") > 2


def test_hosts_file_names_and_every_literal_spelling_still_resolve_without_dns(dns):
    from app.infra.http import resolver

    for spelling in ("127.0.0.1", "0x7f000001", "2130706433", "0177.0.0.1", "localhost", "LOCALHOST."):
        assert [str(a) for a in resolver.lookup(spelling)] == ["127.0.0.1"], spelling
    assert [str(a) for a in resolver.lookup("::ffff:127.0.0.1")] == ["::ffff:7f00:1"]
    assert sum(dns.asked.values()) == 0


GEVENT_SCRIPT = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import socket, sys, time
    import gevent
    from app.config import get_settings, set_settings
    from app.infra.http import resolver
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)   # a nameserver that never answers
    silent.bind(("127.0.0.1", 0))
    set_settings(get_settings().with_overrides(
        resolve_nameservers="127.0.0.1:%d" % silent.getsockname()[1], resolve_timeout_seconds=1.0))
    peak, ticks_during = [0], [0]
    def look(i):
        try:
            resolver.lookup("slow%d.example" % i, "tenant-b")
        except resolver.NotResolved as exc:
            return exc.timed_out
    def watch():
        while True:
            n = resolver.in_flight.held["tenant-b"]
            peak[0] = max(peak[0], n)
            if n:
                ticks_during[0] += 1
            gevent.sleep(0.01)
    w = gevent.spawn(watch)
    jobs = [gevent.spawn(look, i) for i in range(4)]
    gevent.joinall(jobs, timeout=30)
    w.kill()
    print(peak[0], ticks_during[0], all(j.value for j in jobs))
""")


def test_lookups_are_cooperative_under_gevent():
    """The API runs gevent workers: four hanging lookups are in flight at
    once and the hub keeps running other greenlets meanwhile."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ASYNCH_DEV_MODE": "1"}
    out = subprocess.run([sys.executable, "-c", GEVENT_SCRIPT], capture_output=True, text=True, env=env,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    peak, ticks, all_timed_out = out.stdout.split()
    assert int(peak) == 4 and int(ticks) > 10 and all_timed_out == "True", out.stdout


# --- item 9: ports ------------------------------------------------------------------------

PUBLIC = "93.184.216.34"


def _faces(client, make_model, user_key):
    """Submit ``url`` through each face that takes a callback/webhook URL; (status, message)."""
    make_model("m", queue_limit=1000)

    def v1_callback(url):
        r = client.post("/v1/models/m/jobs", json={}, headers={**auth(user_key), "X-Callback-Url": url})
        return r.status_code, r.get_data(as_text=True)

    def v1_webhook(url):
        r = client.post("/v1/models/m/jobs", json={}, headers={**auth(user_key), "X-Webhook-Url": url})
        return r.status_code, r.get_data(as_text=True)

    def batch(url):
        r = client.post("/v1/models/m/jobs:batch", json={"jobs": [{"payload": {}, "callback_url": url},
                                                                   {"payload": {}, "webhook_url": url}]},
                        headers=auth(user_key))
        res = r.get_json()["results"]
        assert res[0]["status"] == res[1]["status"], res
        return res[0]["status"], str(res)

    def seed(url):
        r = client.post("/task/createTask", headers=auth(user_key),
                        json={"modelName": "m", "requestPayload": {}, "callbackUrl": url})
        return r.status_code, r.get_data(as_text=True)

    def subscription(url):
        r = client.post("/v1/tenants/tenant-a/webhooks", json={"url": url}, headers=auth(user_key))
        if r.status_code == 201:
            client.delete(f"/v1/tenants/tenant-a/webhooks/{r.get_json()['id']}", headers=auth(user_key))
        return r.status_code, r.get_data(as_text=True)

    return {"v1 X-Callback-Url": v1_callback, "v1 X-Webhook-Url": v1_webhook, "batch items": batch,
            "seed createTask": seed, "webhook subscription": subscription}


def test_only_web_and_unprivileged_ports_on_every_face(client, make_model, user_key, settings):
    set_settings(settings.with_overrides(callback_allow_hosts=""))
    for face, send in _faces(client, make_model, user_key).items():
        for port in (0, 1, 22, 25, 1023):
            status, text = send(f"http://{PUBLIC}:{port}/cb")
            assert status == 422, (face, port, text)
            assert ("port 0 is not a port" if port == 0 else f"port {port} is not allowed") in text, (face, text)
        for url in (f"http://{PUBLIC}/cb", f"https://{PUBLIC}/cb", f"http://{PUBLIC}:443/cb",
                    f"http://{PUBLIC}:1024/cb", f"http://{PUBLIC}:6379/cb", f"http://{PUBLIC}:65535/cb"):
            status, text = send(url)
            assert status in (200, 201, 202), (face, url, text)  # seed: 200


@pytest.mark.parametrize("allow", [PUBLIC, "93.184.216.0/24"])
def test_an_allowlisted_host_may_use_any_port_but_zero(client, make_model, user_key, settings, allow):
    set_settings(settings.with_overrides(callback_allow_hosts=allow))
    for face, send in _faces(client, make_model, user_key).items():
        assert send(f"http://{PUBLIC}:25/cb")[0] in (200, 201, 202), face
        status, text = send(f"http://{PUBLIC}:0/cb")
        assert status == 422 and "port 0 is not a port" in text, (face, text)


def test_a_delivery_rechecks_the_port(settings):
    """A row admitted before the rule (or under an allowlist since removed)
    is refused at delivery, for good (not transient)."""
    set_settings(settings.with_overrides(callback_allow_hosts=""))
    with pytest.raises(netguard.UrlRefused) as exc:
        netguard.check_url(f"http://{PUBLIC}:25/cb")
    assert not exc.value.transient
