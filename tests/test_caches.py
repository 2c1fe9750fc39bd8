"""The per-process caches on the admission path, and their invalidation
over pub/sub (what another API process's change looks like to this one)."""
from __future__ import annotations

import time

from helpers import make_key, wait_until
from sqlalchemy import update

from app.catalog import registry as model_registry
from app.config import set_settings
from app.infra.db import transaction
from app.infra.redis import events
from app.infra.tables import api_keys, models
from app.infra.wakeups import hub
from app.tenancy.keys import _cache as _key_cache, authenticate


def _changed_elsewhere(stmt) -> None:
    # A write this process's caches know nothing about.
    with transaction() as conn:
        conn.execute(stmt)


def _settled(cache) -> None:
    """Every invalidation published so far has reached this process: make_model publishes one, and
    arriving after the next read it would drop what that read cached.  Ours goes last (pub/sub keeps
    order); the first move of the cache's generation may be make_model's, so wait until it stays put."""
    token = cache.token()
    events.publish_invalidate("models")
    wait_until(lambda: cache.token() != token, timeout=5, what="this process's listener caught up")
    for _ in range(20):
        token = cache.token()
        time.sleep(0.5)
        if cache.token() == token:
            return
    raise AssertionError("the model cache kept being invalidated")


def test_model_cache_is_dropped_on_an_invalidation_message(make_model, settings):
    make_model("m", queue_limit=5)
    # A TTL no pause of a loaded machine reaches: only the message may drop the entry.
    set_settings(settings.with_overrides(model_cache_seconds=60))
    try:
        hub.ensure_started()
        _settled(model_registry._cache)  # its clear rebuilds the cache with that TTL
        assert model_registry.enabled_model("m").queue_limit == 5
        _changed_elsewhere(update(models).where(models.c.model_name == "m").values(queue_limit=7))
        assert model_registry.enabled_model("m").queue_limit == 5  # cached
        events.publish_invalidate("models")
        wait_until(lambda: model_registry.enabled_model("m").queue_limit == 7, timeout=5, what="invalidation")
    finally:
        set_settings(settings)
        model_registry._cache.clear()


def test_revoked_key_stops_working_on_an_invalidation_message(settings):
    key = make_key("t")
    set_settings(settings.with_overrides(auth_cache_seconds=60))  # only the message may drop the entry
    try:
        hub.ensure_started()
        _key_cache.clear()  # rebuilt with that TTL
        assert authenticate(key).tenant_id == "t"
        _changed_elsewhere(update(api_keys).values(revoked_at=api_keys.c.created_at))
        assert authenticate(key).tenant_id == "t"  # cached
        events.publish_invalidate("keys")

        def rejected():
            try:
                authenticate(key)
                return False
            except Exception as exc:
                return "invalid API key" in str(exc)

        wait_until(rejected, timeout=5, what="revocation")
    finally:
        set_settings(settings)
        _key_cache.clear()
