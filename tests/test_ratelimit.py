"""Request rate limits per API key (app/infra/ratelimit.py, app/web/ratelimit.py):
the token bucket in one Lua step on real Redis, through the real app."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import requests
from helpers import auth, make_key

from app.config import set_settings
from app.infra.redis import ratelimit as bucket
from app.infra.redis.ratelimit import Take, bucket_key
from app.tenancy.keys import Principal
from app.web import ratelimit
from app.web.ratelimit import (
    RatePolicy,
    default_policy,
    header_fields,
    set_policy_resolver,
)

ROUTE = "/v1/model-types"       # a cheap authenticated read
SEED_ROUTE = "/modelType/list"  # the same on the seed-002 face


@pytest.fixture(autouse=True)
def _limiter_state():
    ratelimit.reset()
    set_policy_resolver(None)
    yield
    ratelimit.reset()
    set_policy_resolver(None)


def limits(settings, rate: float, burst: int = 0) -> None:
    # clean_state (conftest) puts the session settings back after the test.
    set_settings(settings.with_overrides(rate_limit_per_second=rate, rate_limit_burst=burst))


def bucket_keys(r) -> list[str]:
    return sorted(r.scan_iter(match=bucket_key("*")))


# --- the header strings (draft-ietf-httpapi-ratelimit-headers-11) --------------------------

def test_header_fields_exact_strings():
    p = RatePolicy(10, 20)
    assert header_fields(p, Take(True, 6.3, 0.0, 1.37)) == {
        "RateLimit-Policy": '"default";q=20;w=2',
        "RateLimit": '"default";r=6;t=1',
    }
    slow = RatePolicy(0.5, 1)
    assert header_fields(slow, Take(False, 0.25, 1.5, 1.5)) == {
        "RateLimit-Policy": '"default";q=1;w=2',
        "Retry-After": "2",
        "RateLimit": '"default";r=0;t=2',
    }
    # A full bucket: no token is on its way, the effective window is 0.
    assert header_fields(RatePolicy(3, 7, "perkey"), Take(True, 7.0, 0.0, 0.0)) == {
        "RateLimit-Policy": '"perkey";q=7;w=3',
        "RateLimit": '"perkey";r=7;t=0',
    }
    # Refused by a hair: Retry-After is never 0.
    assert header_fields(RatePolicy(1000, 5), Take(False, 0.9999, 0.0000001, 0.005))["Retry-After"] == "1"


def test_policy_window_and_default_burst(settings):
    assert RatePolicy(0.6, 6).window == 10  # not 11: 6 / 0.6 is 10.000000000000002 in floats
    assert RatePolicy(100, 5).window == 1
    p = Principal("t", "user", 1)
    limits(settings, 0)
    assert default_policy(p) is None
    limits(settings, 0.3)
    assert default_policy(p) == RatePolicy(0.3, 1)
    limits(settings, 2.5)
    assert default_policy(p) == RatePolicy(2.5, 5)
    limits(settings, 2.5, burst=40)
    assert default_policy(p) == RatePolicy(2.5, 40)
    for bad in (dict(rate=0, burst=1), dict(rate=1, burst=0), dict(rate=1, burst=1, name='a"b'),
                dict(rate=1e-12, burst=5), dict(rate=float("nan"), burst=1)):
        with pytest.raises(ValueError):
            RatePolicy(**bad)


# --- through the app ------------------------------------------------------------------------

def test_burst_then_429_with_retry_after(client, settings, r):
    limits(settings, 1, burst=3)
    key = make_key("acme")
    seen = []
    for _ in range(3):
        resp = client.get(ROUTE, headers=auth(key))
        assert resp.status_code == 200
        assert resp.headers["RateLimit-Policy"] == '"default";q=3;w=3'
        assert "Retry-After" not in resp.headers
        seen.append(resp.headers["RateLimit"])
    assert seen == ['"default";r=2;t=1', '"default";r=1;t=1', '"default";r=0;t=1']
    resp = client.get(ROUTE, headers=auth(key))
    assert resp.status_code == 429
    assert resp.get_json() == {"error": "rate limit exceeded for this key: 1 requests/s, bursts of 3; retry after 1 s"}
    assert resp.headers["Retry-After"] == "1"
    assert resp.headers["RateLimit"] == '"default";r=0;t=1'
    assert resp.headers["RateLimit-Policy"] == '"default";q=3;w=3'
    # One hash per key, under the deployment's prefix, that expires once full again.
    [k] = bucket_keys(r)
    assert k == f"{settings.redis_prefix}:ratelimit:{_key_id(key)}"
    assert 0 < r.pttl(k) <= 3000 + 1000


def _key_id(key: str) -> int:
    from app.tenancy.keys import authenticate

    return authenticate(key).key_id


def test_bucket_refills_over_time(client, settings):
    limits(settings, 5, burst=2)
    key = make_key("acme")
    assert [client.get(ROUTE, headers=auth(key)).status_code for _ in range(3)] == [200, 200, 429]
    time.sleep(0.25)  # 1.25 tokens at 5/s
    resp = client.get(ROUTE, headers=auth(key))
    assert resp.status_code == 200 and resp.headers["RateLimit"] == '"default";r=0;t=1'
    assert client.get(ROUTE, headers=auth(key)).status_code == 429
    time.sleep(0.45)  # >= 2 tokens: the bucket is full again, never fuller
    assert [client.get(ROUTE, headers=auth(key)).status_code for _ in range(3)] == [200, 200, 429]


def test_keys_have_separate_buckets_within_and_across_tenants(client, settings):
    limits(settings, 0.5, burst=2)
    a1, a2, b1 = make_key("acme"), make_key("acme"), make_key("globex")
    assert [client.get(ROUTE, headers=auth(a1)).status_code for _ in range(3)] == [200, 200, 429]
    for other in (a2, b1):
        resp = client.get(ROUTE, headers=auth(other))
        assert resp.status_code == 200 and resp.headers["RateLimit"].startswith('"default";r=1;')
    assert client.get(ROUTE, headers=auth(a1)).status_code == 429


def test_bootstrap_key_has_its_own_bucket(client, settings, r):
    set_settings(settings.with_overrides(rate_limit_per_second=0.5, rate_limit_burst=1,
                                         bootstrap_admin_key="boot-" + "x" * 40))
    boot = auth("boot-" + "x" * 40)
    assert [client.get(ROUTE, headers=boot).status_code for _ in range(2)] == [200, 429]
    assert bucket_keys(r) == [bucket_key("bootstrap")]
    assert client.get(ROUTE, headers=auth(make_key("acme"))).status_code == 200


def test_seed_face_answers_429_in_its_envelope(client, settings):
    limits(settings, 0.5, burst=1)
    key = make_key("acme")
    ok = client.get(SEED_ROUTE, headers=auth(key))
    assert ok.status_code == 200 and ok.get_json()["code"] == 0
    assert ok.headers["RateLimit"] == '"default";r=0;t=2'
    resp = client.get(SEED_ROUTE, headers=auth(key))
    assert resp.status_code == 429
    assert resp.get_json() == {"code": 429, "data": None,
                               "message": "rate limit exceeded for this key: 0.5 requests/s, bursts of 1; "
                                          "retry after 2 s"}
    assert resp.headers["Retry-After"] == "2"
    assert resp.headers["RateLimit"] == '"default";r=0;t=2'
    assert resp.headers["RateLimit-Policy"] == '"default";q=1;w=2'


def test_errors_after_the_take_carry_the_fields_too(client, settings):
    limits(settings, 1, burst=3)
    key = make_key("acme")
    resp = client.get("/v1/models/nope/jobs/00000000-0000-0000-0000-000000000000", headers=auth(key))
    assert resp.status_code == 404 and resp.headers["RateLimit"] == '"default";r=2;t=1'
    # No key: the key's bucket is not touched; the client address's anonymous one is (issue 21).
    resp = client.get(ROUTE)
    assert resp.status_code == 401 and resp.headers["RateLimit-Policy"].startswith('"anon";')


def test_off_means_no_fields_and_no_redis_key(client, settings, r):
    limits(settings, 0)
    key = make_key("acme")
    for _ in range(20):
        resp = client.get(ROUTE, headers=auth(key))
        assert resp.status_code == 200
        assert not {"RateLimit", "RateLimit-Policy", "Retry-After"} & set(resp.headers.keys())
    # Every take writes its bucket (HSET, PEXPIRE), so no key means no take.
    assert bucket_keys(r) == []


def test_resolver_gives_tenants_their_own_policies(client, settings):
    limits(settings, 0.5, burst=1)
    vip = RatePolicy(100, 50, "vip")
    set_policy_resolver(lambda p: vip if p.tenant_id == "vip" else (None if p.tenant_id == "free" else
                                                                     default_policy(p)))
    v, f, d = make_key("vip"), make_key("free"), make_key("acme")
    assert [client.get(ROUTE, headers=auth(v)).status_code for _ in range(10)] == [200] * 10
    assert client.get(ROUTE, headers=auth(v)).headers["RateLimit-Policy"] == '"vip";q=50;w=1'
    assert "RateLimit" not in client.get(ROUTE, headers=auth(f)).headers
    assert [client.get(ROUTE, headers=auth(d)).status_code for _ in range(2)] == [200, 429]


@pytest.fixture
def dead_redis(settings):
    """The limiter's Redis is a port nobody listens on; restored afterwards."""
    from helpers import free_port

    from app.infra.redis.client import reset_redis

    def _down(**kw):
        set_settings(settings.with_overrides(redis_url=f"redis://127.0.0.1:{free_port()}/0", **kw))
        reset_redis()

    def _up(**kw):
        set_settings(settings.with_overrides(**kw))
        reset_redis()

    yield _down, _up
    set_settings(settings)
    reset_redis()


@pytest.fixture
def warnings_of_limiter():
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("app.web.ratelimit")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_redis_down_fails_open_then_stands_aside(client, dead_redis, r, warnings_of_limiter):
    down, up = dead_redis
    key = make_key("acme")
    down(rate_limit_per_second=0.5, rate_limit_burst=1)
    for _ in range(3):
        resp = client.get(ROUTE, headers=auth(key))
        assert resp.status_code == 200 and "RateLimit" not in resp.headers
    assert len(warnings_of_limiter) == 1 and "requests pass unlimited" in warnings_of_limiter[0].getMessage()
    # Redis is back, but within BYPASS_SECONDS of the failure the limiter
    # does not even try (an outage must not add a timeout to every request).
    up(rate_limit_per_second=0.5, rate_limit_burst=1)
    assert [client.get(ROUTE, headers=auth(key)).status_code for _ in range(2)] == [200, 200]
    assert bucket_keys(r) == []
    ratelimit.reset()  # as if BYPASS_SECONDS had passed
    assert [client.get(ROUTE, headers=auth(key)).status_code for _ in range(2)] == [200, 429]


def test_fail_open_warning_is_rate_limited(client, dead_redis, warnings_of_limiter, monkeypatch):
    monkeypatch.setattr(ratelimit, "BYPASS_SECONDS", 0.0)  # every request tries Redis and fails
    down, _ = dead_redis
    key = make_key("acme")
    down(rate_limit_per_second=0.5, rate_limit_burst=1)
    assert [client.get(ROUTE, headers=auth(key)).status_code for _ in range(5)] == [200] * 5
    assert len(warnings_of_limiter) == 1


# --- the bucket itself -------------------------------------------------------------------------

def test_bucket_uses_redis_time_and_survives_a_clock_step_back(r):
    k = bucket_key("skew")
    # The last take stamped an hour in the future (a Redis failover to a host
    # whose clock is behind): no refill for the step, but no frozen bucket.
    r.hset(k, mapping={"tk": "0", "ts": f"{time.time() + 3600:.6f}"})
    assert not bucket.take("skew", 20, 2).allowed
    time.sleep(0.06)  # > 1 token at 20/s, on Redis's clock
    assert bucket.take("skew", 20, 2).allowed
    assert float(r.hget(k, "ts")) < time.time() + 5


# --- the invariant under concurrency -------------------------------------------------------------

def test_concurrent_requests_never_exceed_burst_plus_rate_times_elapsed(api_url, settings, r):
    """16 threads x 25 requests on one key: admitted <= burst + rate * t (+1),
    t measured around all of them.  Fails if the take is not one atomic step
    (e.g. read-then-write from Python)."""
    rate, burst, threads, per_thread = 20.0, 10, 16, 25
    limits(settings, rate, burst)
    key = make_key("acme")
    codes: list[int] = []
    lock = threading.Lock()
    go = threading.Barrier(threads + 1)

    def worker():
        s = requests.Session()
        go.wait()
        mine = [s.get(api_url + ROUTE, headers=auth(key), timeout=30).status_code for _ in range(per_thread)]
        with lock:
            codes.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    go.wait()
    t0 = time.monotonic()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - t0
    admitted = codes.count(200)
    assert set(codes) <= {200, 429} and len(codes) == threads * per_thread
    bound = burst + rate * elapsed + 1
    assert admitted <= bound, f"admitted {admitted} in {elapsed:.2f}s, bound {bound:.1f}"
    assert admitted >= burst and codes.count(429) > 0  # it did admit the burst and did refuse
